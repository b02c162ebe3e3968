//! Episodes of pressure at a rule's aggregate, and which sources are young in
//! them (see [`crate::RuleState`]): pure functions of the two words the
//! program keeps per rule, so that the kernel program only reads and writes.

use crate::{EPISODE_QUIET_NS, REFUSAL_MARK_NS};

/// A source whose state was created at `born` (`u64::MAX`: no state yet) is
/// young at `now`, given the rule's `episode` (when the current or last
/// episode began, 0 for none yet) and `refused_at` (its last refusal): it has
/// no state, or an episode is under way and began before the state was made.
#[inline(always)]
pub fn is_young(born: u64, episode: u64, refused_at: u64, now: u64) -> bool {
    born == u64::MAX
        || (episode != 0
            && born >= episode
            && now.saturating_sub(refused_at) <= EPISODE_QUIET_NS + REFUSAL_MARK_NS)
}

/// What a refusal at `now` writes, given the last one at `refused_at`: `None`
/// when one was noted less than [`REFUSAL_MARK_NS`] ago (nothing to write),
/// else whether a new episode begins (after [`EPISODE_QUIET_NS`] without a
/// refusal, or at the first); `refused_at` becomes `now` either way.
#[inline(always)]
pub fn on_refusal(refused_at: u64, now: u64) -> Option<bool> {
    let since = now.saturating_sub(refused_at);
    if refused_at != 0 && since < REFUSAL_MARK_NS {
        return None;
    }
    Some(refused_at == 0 || since > EPISODE_QUIET_NS)
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: u64 = 1_000_000_000;

    #[test]
    fn an_episode_begins_at_the_first_refusal_and_after_a_quiet_minute() {
        assert_eq!(on_refusal(0, 5 * S), Some(true), "the first refusal");
        assert_eq!(
            on_refusal(5 * S, 5 * S + 1),
            None,
            "within the mark: nothing written"
        );
        assert_eq!(
            on_refusal(5 * S, 6 * S),
            Some(false),
            "the same episode goes on"
        );
        assert_eq!(
            on_refusal(5 * S, 65 * S),
            Some(false),
            "exactly a minute: still on"
        );
        assert_eq!(
            on_refusal(5 * S, 66 * S),
            Some(true),
            "after a quiet minute: a new one"
        );
        // Another CPU noted a later time: no underflow, nothing written.
        assert_eq!(on_refusal(7 * S, 6 * S), None);
    }

    #[test]
    fn sources_without_a_state_or_born_in_the_episode_are_young() {
        let (episode, refused) = (100 * S, 130 * S);
        assert!(
            is_young(u64::MAX, 0, 0, S),
            "no state: young, episode or not"
        );
        assert!(
            !is_young(99 * S, episode, refused, 131 * S),
            "born before: established"
        );
        assert!(
            is_young(100 * S, episode, refused, 131 * S),
            "born as it began: young"
        );
        assert!(
            is_young(120 * S, episode, refused, 131 * S),
            "born during: young"
        );
        assert!(
            !is_young(120 * S, episode, refused, 200 * S),
            "the episode ended: established"
        );
        assert!(
            !is_young(120 * S, 0, 0, 131 * S),
            "no episode ever: established"
        );
    }
}
