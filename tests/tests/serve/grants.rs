//! `ratelimit serve`: refunds bound to grants (issue 25, observation 7), and
//! batch acquires, against a real `redis-server`. No root needed.

use std::{thread::sleep, time::Duration};

use ratelimit_tests::{
    redis::RedisServer,
    serve::{Service, post},
};
use serde_json::{Value, json};

/// Nothing refills during a test: 10 an hour.
fn slow() -> Value {
    json!({"rate": "10/hour", "burst": 10})
}

fn acquire(s: &Service, key: &str, amount: u64, limit: Value) -> Value {
    let (status, r) = s.post(
        "/v1/acquire",
        json!({"key": key, "amount": amount, "limit": limit}),
    );
    assert_eq!(status, 200, "acquire {key} {amount}: {r}");
    r
}

fn refill(s: &Service, grant: &Value, unused: u64) -> Value {
    let (status, r) = s.post("/v1/refill", json!({"grant": grant, "amount": unused}));
    assert_eq!(status, 200, "refill {grant} {unused}: {r}");
    r
}

fn got(r: &Value, field: &str) -> u64 {
    r[field]
        .as_u64()
        .unwrap_or_else(|| panic!("no {field} in {r}"))
}

/// (Observation 7) A retried refill refunded twice. The amount a refill names
/// is what the grant did not use in all: a retry gives nothing more, a later
/// refill that knows of more unused units gives the difference, and the
/// answer and the metric say what was really given back.
#[test]
fn a_retried_refill_refunds_once() {
    let redis = RedisServer::start();
    let s = Service::start(&redis, &[]);
    let r = acquire(&s, "k", 5, slow());
    assert_eq!((got(&r, "granted"), got(&r, "remaining")), (5, 5), "{r}");
    let grant = r["grant"].clone();
    assert!(
        grant.is_string(),
        "an acquire that took units answers a grant: {r}"
    );

    let r = refill(&s, &grant, 3);
    assert_eq!(
        (
            got(&r, "refunded"),
            got(&r, "remaining"),
            got(&r, "taken"),
            got(&r, "unused")
        ),
        (3, 8, 5, 3),
        "{r}"
    );
    for _ in 0..3 {
        let r = refill(&s, &grant, 3);
        assert_eq!(
            (got(&r, "refunded"), got(&r, "remaining")),
            (0, 8),
            "a retry refunded again: {r}"
        );
    }
    let r = refill(&s, &grant, 4);
    assert_eq!((got(&r, "refunded"), got(&r, "remaining")), (1, 9), "{r}");
    let r = refill(&s, &grant, 2);
    assert_eq!(
        got(&r, "refunded"),
        0,
        "a smaller amount takes nothing back: {r}"
    );
    assert_eq!(s.metric("ratelimit_serve_refunded_units_total"), Some(4.0));
    // The bucket agrees: 9 there, not one more.
    let r = acquire(&s, "k", 10, slow());
    assert_eq!(got(&r, "granted"), 9, "{r}");
}

/// (Observation 7) A refill of 1 000 000 against 3 owed answered 1 000 000 and
/// counted 9e15; one client raised another's grants. A refill gives back at
/// most what its grant took.
#[test]
fn a_refill_gives_back_at_most_what_its_grant_took() {
    let redis = RedisServer::start();
    let s = Service::start(&redis, &[]);
    let mine = acquire(&s, "shared", 3, slow());
    let theirs = acquire(&s, "shared", 5, slow());
    assert_eq!(got(&theirs, "remaining"), 2, "{theirs}");
    let r = refill(&s, &mine["grant"], 1_000_000);
    assert_eq!(
        (got(&r, "refunded"), got(&r, "remaining"), got(&r, "unused")),
        (3, 5, 3),
        "{r}"
    );
    assert_eq!(s.metric("ratelimit_serve_refunded_units_total"), Some(3.0));
    // The other client's grant is its own: 5 back, never above the burst.
    let r = refill(&s, &theirs["grant"], 1_000_000);
    assert_eq!((got(&r, "refunded"), got(&r, "remaining")), (5, 10), "{r}");
    let r = refill(&s, &theirs["grant"], 1_000_000);
    assert_eq!(got(&r, "refunded"), 0, "{r}");
    assert_eq!(s.metric("ratelimit_serve_refunded_units_total"), Some(8.0));
    // A made-up grant is refused; an acquire that took nothing has none.
    let (status, r) = s.post("/v1/refill", json!({"grant": "not-a-grant", "amount": 1}));
    assert_eq!((status, r["field"].as_str()), (400, Some("grant")), "{r}");
    // A caller that never refills asks for no grant: none is kept.
    let (status, r) = s.post(
        "/v1/acquire",
        json!({"key": "nogrant", "limit": slow(), "grant": false}),
    );
    assert_eq!(
        (status, got(&r, "granted"), &r["grant"]),
        (200, 1, &Value::Null),
        "{r}"
    );
    assert_eq!(redis.cmd("KEYS ratelimit:{nogrant}:g:*").trim(), "*0");
    for _ in 0..10 {
        acquire(&s, "shared", 1, slow());
    }
    let r = acquire(&s, "shared", 1, slow());
    assert_eq!((got(&r, "granted"), &r["grant"]), (0, &Value::Null), "{r}");
}

/// A grant's units come back by themselves as the bucket refills, the
/// grant's last: a refill gives back only those still out, so that it never
/// admits more than the grant would have had it asked only for what it used.
#[test]
fn units_back_by_themselves_are_not_refunded_again() {
    let redis = RedisServer::start();
    let s = Service::start(&redis, &[]);
    // 10 a second, a bucket of 10: one unit back every 100 ms.
    let fast = json!({"rate": "10/s", "burst": 10});
    let r = acquire(&s, "k", 10, fast.clone());
    let grant = r["grant"].clone();
    sleep(Duration::from_millis(500));
    // Another takes what came back meanwhile.
    let other = acquire(&s, "k", 10, fast.clone());
    let back = got(&other, "granted");
    assert!((4..=10).contains(&back), "{other}");
    let r = refill(&s, &grant, 10);
    let refunded = got(&r, "refunded");
    assert!(
        refunded <= 10 - back,
        "{back} of the grant's units came back by themselves and were taken again; \
         the refill gave {refunded} more: {r}"
    );
}

/// (Observation 7) A refill naming another limit (burst 1 000) restored far
/// more than it returned. A grant is refilled under its own limit; a keyed
/// refill (the open mode's) under another limit than the key's is refused.
#[test]
fn a_refill_under_another_limit_is_refused() {
    let redis = RedisServer::start();
    let s = Service::start(&redis, &[]);
    let r = acquire(&s, "k", 10, slow());
    assert_eq!(got(&r, "remaining"), 0);
    let (status, r) = s.post(
        "/v1/refill",
        json!({"key": "k", "amount": 3, "limit": {"rate": "10/hour", "burst": 1000}}),
    );
    assert_eq!(status, 409, "{r}");
    assert_eq!(
        (r["field"].as_str(), got(&r, "refunded")),
        (Some("limit"), 0),
        "{r}"
    );
    // The same limit, or none (the key's own): refunded.
    let (status, r) = s.post("/v1/refill", json!({"key": "k", "amount": 3}));
    assert_eq!(
        (status, got(&r, "refunded"), got(&r, "remaining")),
        (200, 3, 3),
        "{r}"
    );

    // A grant, then the key written under another limit: the grant refunds
    // nothing, and says why.
    let g = acquire(&s, "g", 4, slow());
    acquire(&s, "g", 1, json!({"rate": "10/hour", "burst": 1000}));
    let (status, r) = s.post("/v1/refill", json!({"grant": g["grant"], "amount": 4}));
    assert_eq!(status, 409, "{r}");
    assert_eq!(got(&r, "refunded"), 0, "{r}");
    // A grant refill names nothing but the grant.
    let (status, r) = s.post(
        "/v1/refill",
        json!({"grant": g["grant"], "amount": 1, "limit": {"rate": "10/hour", "burst": 1000}}),
    );
    assert_eq!((status, r["field"].as_str()), (400, Some("limit")), "{r}");
}

/// (Observation 7) An unknown key answered `remaining: 0` though it is full.
#[test]
fn an_unknown_key_answers_full() {
    let redis = RedisServer::start();
    let s = Service::start(&redis, &[]);
    let (status, r) = s.post(
        "/v1/refill",
        json!({"key": "never", "amount": 1, "limit": slow()}),
    );
    assert_eq!(
        (status, got(&r, "refunded"), got(&r, "remaining")),
        (200, 0, 10),
        "{r}"
    );
    // Without a limit, how many "full" is cannot be known: null, not 0.
    let (status, r) = s.post("/v1/refill", json!({"key": "never", "amount": 1}));
    assert_eq!((status, &r["remaining"]), (200, &Value::Null), "{r}");
    // A grant whose key is full again (a keyed refill gave all back).
    let g = acquire(&s, "k", 5, slow());
    let (_, r) = s.post("/v1/refill", json!({"key": "k", "amount": 5}));
    assert_eq!(got(&r, "remaining"), 10, "{r}");
    let r = refill(&s, &g["grant"], 5);
    assert_eq!((got(&r, "refunded"), got(&r, "remaining")), (0, 10), "{r}");
}

/// Many keys in one request: each answered as alone, in one Redis call.
#[test]
fn a_batch_acquires_many_keys_in_one_call() {
    let redis = RedisServer::start();
    let s = Service::start(&redis, &[]);
    let items: Vec<Value> = (0..50)
        .map(|i| json!({"key": format!("b{i}"), "amount": 1 + i % 3, "limit": slow()}))
        .collect();
    let calls = s.metric("ratelimit_serve_redis_calls_total").unwrap_or(0.0);
    let (status, r) = s.post("/v1/acquire", json!({"acquire": items}));
    assert_eq!(status, 200, "{r}");
    let results = r["results"].as_array().expect("results");
    assert_eq!(results.len(), 50);
    for (i, a) in results.iter().enumerate() {
        let amount = 1 + i as u64 % 3;
        assert_eq!(
            (
                a["allowed"].as_bool(),
                got(a, "granted"),
                got(a, "remaining")
            ),
            (Some(true), amount, 10 - amount),
            "{a}"
        );
        assert!(a["grant"].is_string(), "{a}");
    }
    assert_eq!(
        s.metric("ratelimit_serve_redis_calls_total").unwrap_or(0.0) - calls,
        1.0,
        "50 keys in one request are one Redis call"
    );
    // Each grant is its own.
    let r = refill(&s, &results[4]["grant"], 2);
    assert_eq!((got(&r, "refunded"), got(&r, "remaining")), (2, 10), "{r}");
    // A bad item names itself.
    let (status, r) = s.post(
        "/v1/acquire",
        json!({"acquire": [{"key": "a", "limit": slow()}, {"key": "b", "limit": {"rate": "fast"}}]}),
    );
    assert_eq!(
        (status, r["field"].as_str()),
        (400, Some("acquire[1].limit.rate")),
        "{r}"
    );
}

/// 32 clients at once on one key through one replica (their acquires share
/// Redis calls): the limit holds exactly.
#[test]
fn thirty_two_clients_sharing_calls_admit_exactly_one_limit() {
    let redis = RedisServer::start();
    let s = Service::start(&redis, &[]);
    let port = s.port;
    let handles: Vec<_> = (0..32)
        .map(|_| {
            std::thread::spawn(move || {
                let mut granted = 0;
                for _ in 0..20 {
                    let (status, r) = post(
                        port,
                        "/v1/acquire",
                        json!({"key": "hot", "limit": {"rate": "100/hour", "burst": 100}}),
                    );
                    assert_eq!(status, 200, "{r}");
                    granted += got(&r, "granted");
                }
                granted
            })
        })
        .collect();
    let total: u64 = handles.into_iter().map(|h| h.join().unwrap()).sum();
    assert_eq!(total, 100, "640 acquires of one key, a limit of 100");
    eprintln!(
        "640 acquires in {} Redis calls",
        s.metric("ratelimit_serve_redis_calls_total").unwrap_or(0.0)
    );
}

/// (Issue 37, observation 1) Grant ids were a counter's SplitMix64 outputs:
/// one grant told every later id, and anyone who knew a key refilled
/// another caller's grant. Now an id is 128 bits of the OS's random source:
/// the 1 000 ids after a caller's own (any counter scheme's next guesses)
/// refund nothing, answer `unknown`, and the victim's own refill still gives
/// its units back.
#[test]
fn the_ids_after_ones_own_grant_refund_nothing() {
    let redis = RedisServer::start();
    let s = Service::start(&redis, &[]);
    let limit = json!({"rate": "10/hour", "burst": 10});
    let mine = acquire(&s, "victim-key", 1, limit.clone());
    let victims = acquire(&s, "victim-key", 9, limit.clone());
    assert_eq!(got(&victims, "remaining"), 0, "{victims}");
    let token = |g: &Value| g.as_str().expect("a grant").to_string();
    let (my_id, text) = token(&mine["grant"])
        .split_once('.')
        .map(|(i, t)| (i.to_string(), t.to_string()))
        .expect("ID.TEXT");
    let victim_id = token(&victims["grant"])
        .split_once('.')
        .unwrap()
        .0
        .to_string();
    assert_eq!(my_id.len(), 32, "128 bits: {my_id}");
    assert_ne!(my_id, victim_id);
    let base = u128::from_str_radix(&my_id, 16).expect("hex");
    // A counter's next values, and (as the old ids were) SplitMix64's next
    // outputs after the counter each half of the id would reveal.
    let (hi, lo) = ((base >> 64) as u64, base as u64);
    let guesses = (1..=500u64).flat_map(|k| {
        [
            base.wrapping_add(u128::from(k)),
            (u128::from(splitmix_next(hi, k)) << 64) | u128::from(splitmix_next(lo, k)),
        ]
    });
    for (k, guess) in guesses.enumerate() {
        let guess = format!("{guess:032x}.{text}");
        let r = refill(&s, &json!(guess), 9);
        assert_eq!(
            (got(&r, "refunded"), r["unknown"].as_bool()),
            (0, Some(true)),
            "guess {k} refunded: {r}"
        );
    }
    let r = acquire(&s, "victim-key", 1, limit);
    assert_eq!(
        got(&r, "granted"),
        0,
        "nothing was given back by a guess: {r}"
    );
    let r = refill(&s, &victims["grant"], 9);
    assert_eq!(got(&r, "refunded"), 9, "the victim's own refill: {r}");
}

/// The `k`-th SplitMix64 output after `out`, found by undoing its finalizer
/// (a bijection) back to the counter.
fn splitmix_next(out: u64, k: u64) -> u64 {
    const GAMMA: u64 = 0x9e37_79b9_7f4a_7c15;
    fn unshift(y: u64, s: u32) -> u64 {
        let mut x = y;
        for _ in 0..64 / s + 1 {
            x = y ^ (x >> s);
        }
        x
    }
    fn inverse(c: u64) -> u64 {
        let mut i = c;
        for _ in 0..6 {
            i = i.wrapping_mul(2u64.wrapping_sub(c.wrapping_mul(i)));
        }
        i
    }
    let mut z = unshift(out, 31);
    z = z.wrapping_mul(inverse(0x94d0_49bb_1331_11eb));
    z = unshift(z, 27);
    z = z.wrapping_mul(inverse(0xbf58_476d_1ce4_e5b9));
    let counter = unshift(z, 30);
    let mut z = counter.wrapping_add(GAMMA.wrapping_mul(k));
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

#[test]
fn splitmix_is_undone() {
    // The old ids: counter c, output f(c + GAMMA); the next is f(c + 2 GAMMA).
    let f = |c: u64| {
        let mut z = c;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    };
    let g = 0x9e37_79b9_7f4a_7c15u64;
    let c = 0x1234_5678_9abc_def0u64;
    assert_eq!(
        splitmix_next(f(c.wrapping_add(g)), 1),
        f(c.wrapping_add(g.wrapping_mul(2)))
    );
}
