//! The system tier: the daemon with the parts of a host it meets in
//! production, real and started by the tests: systemd's checks of the shipped
//! unit and its capabilities ([`service`]), and a CrowdSec Local API whose
//! decisions it enforces ([`crowdsec`]). Root; one test at a time.

mod crowdsec;
mod service;
