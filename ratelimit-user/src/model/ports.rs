//! A rule's destination ports: one port, a range, or a set of both
//! (`22,80,443,8000-8100`), kept as sorted ranges that neither overlap nor
//! touch, at most [`MAX_PORT_RANGES`] of them (what one kernel match entry
//! holds).

use std::{cmp::Ordering, fmt};

use ratelimit_common::{MAX_PORT_RANGES, PortRange};

use crate::error::{Error, Result};

/// Destination ports: sorted ranges, apart (`80-81,82` is `80-82`).
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Ports {
    ranges: [PortRange; MAX_PORT_RANGES],
    len: u8,
}

/// The forms `--dport` takes, for errors.
pub const PORT_FORMS: &str = "a port like 53, a range like 27015-27020, or a list of both like 22,80,443,8000-8100 (ports 0 to 65535)";

impl Ports {
    /// The ports `first` to `last`, inclusive (`first <= last`).
    pub fn range(first: u16, last: u16) -> Self {
        debug_assert!(first <= last);
        Self::of(&[PortRange { first, last }]).expect("one range fits")
    }

    /// The set of `ranges` (each `first <= last`, any order, overlaps
    /// allowed), or `None` if it takes more than [`MAX_PORT_RANGES`]
    /// ranges once merged.
    pub fn of(ranges: &[PortRange]) -> Option<Self> {
        let mut sorted = ranges.to_vec();
        sorted.sort();
        let mut merged: Vec<PortRange> = Vec::new();
        for r in sorted {
            match merged.last_mut() {
                Some(m) if u32::from(r.first) <= u32::from(m.last) + 1 => {
                    m.last = m.last.max(r.last);
                }
                _ => merged.push(r),
            }
        }
        if merged.is_empty() || merged.len() > MAX_PORT_RANGES {
            return None;
        }
        let mut out = Ports {
            ranges: [PortRange::default(); MAX_PORT_RANGES],
            len: merged.len() as u8,
        };
        out.ranges[..merged.len()].copy_from_slice(&merged);
        Some(out)
    }

    /// The ranges, sorted and apart.
    pub fn ranges(&self) -> &[PortRange] {
        &self.ranges[..usize::from(self.len)]
    }

    /// The whole of the kernel's field (unused ranges zero) and how many
    /// are in use.
    pub fn entry(&self) -> ([PortRange; MAX_PORT_RANGES], u8) {
        (self.ranges, self.len)
    }

    /// Whether `port` is one of them.
    pub fn contains(&self, port: u16) -> bool {
        self.ranges()
            .iter()
            .any(|r| r.first <= port && port <= r.last)
    }

    /// How many ports: fewer is more specific.
    pub fn count(&self) -> u32 {
        self.ranges()
            .iter()
            .map(|r| u32::from(r.last) - u32::from(r.first) + 1)
            .sum()
    }

    /// One port or one range, as `(first, last)`.
    pub fn single(&self) -> Option<(u16, u16)> {
        (self.len == 1).then(|| (self.ranges[0].first, self.ranges[0].last))
    }

    /// Parses `53`, `27015-27020` or `22,80,443,8000-8100`; errors name `field`.
    pub fn parse(field: &str, s: &str) -> Result<Self> {
        let bad = |why: String| Error::invalid(field, format!("{why}; expected {PORT_FORMS}"));
        let port = |p: &str| {
            p.trim()
                .parse::<u16>()
                .map_err(|_| bad(format!("{:?} in {s:?} is not a port", p.trim())))
        };
        let mut ranges = Vec::new();
        for part in s.split(',') {
            if part.trim().is_empty() {
                return Err(bad(format!("{s:?} has an empty item")));
            }
            let (first, last) = match part.split_once('-') {
                Some((a, b)) => (port(a)?, port(b)?),
                None => {
                    let p = port(part)?;
                    (p, p)
                }
            };
            if first > last {
                return Err(Error::invalid(
                    field,
                    format!(
                        "{:?} is not a range: the first port comes first",
                        part.trim()
                    ),
                ));
            }
            ranges.push(PortRange { first, last });
        }
        Self::of(&ranges).ok_or_else(|| {
            Error::invalid(
                field,
                format!(
                    "{s:?} takes more than {MAX_PORT_RANGES} ranges (ports that follow each other make one): a rule holds at most {MAX_PORT_RANGES}; write wider ranges or split it into rules"
                ),
            )
        })
    }
}

impl Ord for Ports {
    fn cmp(&self, other: &Self) -> Ordering {
        self.ranges().cmp(other.ranges())
    }
}

impl PartialOrd for Ports {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl fmt::Display for Ports {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, r) in self.ranges().iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            if r.first == r.last {
                write!(f, "{}", r.first)?;
            } else {
                write!(f, "{}-{}", r.first, r.last)?;
            }
        }
        Ok(())
    }
}

impl fmt::Debug for Ports {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Ports({self})")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_set_is_sorted_and_merged_and_reads_back_as_written() {
        let p = Ports::parse("--dport", "443, 22,80,81,82,8000-8100,8050").unwrap();
        assert_eq!(p.to_string(), "22,80-82,443,8000-8100");
        assert_eq!(Ports::parse("--dport", &p.to_string()).unwrap(), p);
        assert_eq!(p.count(), 1 + 3 + 1 + 101);
        for port in [22, 80, 81, 82, 443, 8000, 8100] {
            assert!(p.contains(port), "{port}");
        }
        for port in [0, 21, 23, 79, 83, 442, 444, 7999, 8101, 65535] {
            assert!(!p.contains(port), "{port}");
        }
        assert_eq!(p.single(), None);
        assert_eq!(
            Ports::parse("--dport", "53").unwrap().single(),
            Some((53, 53))
        );
        assert_eq!(Ports::parse("--dport", "0-65535").unwrap().count(), 65_536);
    }

    #[test]
    fn the_largest_set_fits_and_one_more_range_is_refused_by_name() {
        let most: Vec<String> = (0..MAX_PORT_RANGES).map(|i| (i * 10).to_string()).collect();
        let p = Ports::parse("--dport", &most.join(",")).unwrap();
        assert_eq!(p.ranges().len(), MAX_PORT_RANGES);
        let too_many = format!("{},999", most.join(","));
        let e = Ports::parse("rule[0].dport", &too_many)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("rule[0].dport") && e.contains("at most 16"),
            "{e}"
        );
        // Ports that follow each other make one range: 100 of them fit.
        let run: Vec<String> = (1000..1100).map(|p: u32| p.to_string()).collect();
        assert_eq!(
            Ports::parse("--dport", &run.join(",")).unwrap().to_string(),
            "1000-1099"
        );
    }

    #[test]
    fn bad_sets_name_the_field_the_item_and_the_forms() {
        for (s, says) in [
            ("22,,80", "empty item"),
            ("22,http", "\"http\""),
            ("70000", "\"70000\""),
            ("80-60", "first port comes first"),
            ("", "empty item"),
        ] {
            let e = Ports::parse("--dport", s).unwrap_err().to_string();
            assert!(e.contains("--dport") && e.contains(says), "{s:?}: {e}");
        }
    }
}
