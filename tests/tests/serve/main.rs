//! The service tier: `ratelimit serve` against real `redis-server`s (and a
//! 3-master Cluster) started by the tests, on loopback. Root is not needed
//! for most of it; the tests run one at a time all the same.
//!
//! - [`redis`]: the algorithms kept in Redis, equal to the in-process ones;
//! - [`api`]: the HTTP API; [`grants`]: grants, refills and who may make
//!   them; [`config`]: the config file, tenants, TLS, reloads;
//! - [`breaker`]: fail-fast while Redis does not answer;
//! - [`leases`]: hot keys decided in the service from leases;
//! - [`connections`], [`grpc`]: the listeners' bounds, and Envoy's gRPC
//!   protocol through a real Envoy.

mod api;
mod breaker;
mod config;
mod connections;
mod grants;
mod grpc;
mod leases;
mod redis;
