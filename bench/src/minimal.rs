//! The two services `ratelimit serve` is measured beside (issue 37's
//! benchmark): what any HTTP service on axum pays per request, and what a
//! minimal throttling service pays that does no more than the decision.
//!
//! - `echo`: axum answering every `POST /v1/acquire` with a fixed JSON body,
//!   the body read and dropped: the floor of an HTTP/1.1 service on tokio.
//! - `evalsha`: axum and redis-rs (a `ConnectionManager`, the script loaded
//!   once and sent as `EVALSHA`): the body parsed as JSON, its `key` decided
//!   with the same call raw clients send (limit.lua, gcra, one unit), the
//!   answer written as JSON. No grant, no policy, no bounds on connections.
//!
//! Both run with as many worker threads as `ratelimit serve` does by default
//! (half the CPUs, rounded up), started by the bench as
//! `bench --minimal-server KIND PORT [REDIS_URL]`, one process each, so that
//! each one's CPU is read from its own `/proc`.

use std::{net::SocketAddr, sync::Arc};

use axum::{Router, body::Bytes, extract::State, http::StatusCode, routing::post};
use redis::{Script, aio::ConnectionManager};

/// What the `evalsha` service holds.
struct Decider {
    redis: ConnectionManager,
    script: Script,
}

/// Runs the service `kind` on `127.0.0.1:port` until killed.
pub(crate) fn run(kind: &str, port: u16, redis_url: Option<&str>) {
    let threads = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .div_ceil(2);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(threads)
        .enable_all()
        .build()
        .expect("a runtime");
    rt.block_on(async {
        let app = match kind {
            "echo" => Router::new().route(
                "/v1/acquire",
                post(|_body: Bytes| async { r#"{"allowed":true,"granted":1}"# }),
            ),
            "evalsha" => {
                let url = redis_url.expect("evalsha needs a Redis URL");
                let client = redis::Client::open(url).expect("a Redis URL");
                let redis = ConnectionManager::new(client)
                    .await
                    .expect("connecting to Redis");
                let state = Arc::new(Decider {
                    redis,
                    script: Script::new(ratelimit_redis::LIMIT_SCRIPT),
                });
                Router::new()
                    .route("/v1/acquire", post(decide))
                    .with_state(state)
            }
            other => panic!("--minimal-server {other:?}: expected echo or evalsha"),
        };
        let listener = tokio::net::TcpListener::bind(SocketAddr::from(([127, 0, 0, 1], port)))
            .await
            .expect("binding the port");
        axum::serve(listener, app).await.expect("serving");
    });
}

/// One acquire: the key from the JSON body, one `EVALSHA`, the answer.
async fn decide(State(d): State<Arc<Decider>>, body: Bytes) -> (StatusCode, String) {
    let Ok(v) = serde_json::from_slice::<serde_json::Value>(&body) else {
        return (StatusCode::BAD_REQUEST, r#"{"error":"not JSON"}"#.into());
    };
    let Some(key) = v.get("key").and_then(|k| k.as_str()) else {
        return (StatusCode::BAD_REQUEST, r#"{"error":"no key"}"#.into());
    };
    let mut redis = d.redis.clone();
    let reply: redis::RedisResult<Vec<i64>> = d
        .script
        .key(format!("min:{{{key}}}"))
        .arg(&["partial", "gcra", "1", "10000", "20", "1", "0"][..])
        .invoke_async(&mut redis)
        .await;
    match reply {
        Ok(r) => (
            StatusCode::OK,
            // {allowed, granted, remaining, retry_us, now_us}
            serde_json::json!({
                "allowed": r.first().copied().unwrap_or(0) == 1,
                "granted": r.get(1).copied().unwrap_or(0),
                "remaining": r.get(2).copied().unwrap_or(0),
            })
            .to_string(),
        ),
        Err(e) => (
            StatusCode::SERVICE_UNAVAILABLE,
            serde_json::json!({ "error": e.to_string() }).to_string(),
        ),
    }
}
