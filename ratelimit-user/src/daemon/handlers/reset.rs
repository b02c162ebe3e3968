//! `ratelimit reset`: a clean slate, as one change (all or nothing, saved,
//! answered with what it removed). The default rule stays: a host is never
//! left without it.

use crate::{
    daemon::Daemon, error::Result, model::overlay::Layers, protocol::ResetScope,
    protocol::answer::Changed,
};

impl Daemon {
    /// Removes what `scope` names.
    pub(super) fn reset(&mut self, scope: ResetScope) -> Result<Changed> {
        self.change(|layers| {
            reset(layers, scope);
            Ok(())
        })
    }
}

/// Removes from `layers` what `scope` names; the default rule stays.
pub(super) fn reset(layers: &mut Layers, scope: ResetScope) {
    let default = layers.effective().default;
    match scope {
        ResetScope::Live => layers.live = Default::default(),
        ResetScope::Config => remove_base(layers),
        ResetScope::All => {
            let live_default = layers.live.default;
            layers.live = Default::default();
            layers.live.default = live_default;
            remove_base(layers);
            if layers.effective().mode != crate::model::rules::Mode::Normal {
                layers.live.mode = Some(crate::model::rules::Mode::Normal);
            }
        }
    }
    debug_assert!(scope == ResetScope::Live || layers.effective().default == default);
}

/// Removes the config file's rules and lists (live: until `reload
/// --replace`), where no live change stands on top of them.
fn remove_base(layers: &mut Layers) {
    let rules: Vec<_> = layers.base.rules.keys().copied().collect();
    for p in rules {
        if !layers.live.rules.contains_key(&p) {
            layers.set_live(p, None, None);
        }
    }
    let lists: Vec<String> = layers.base.lists.keys().cloned().collect();
    for name in lists {
        if !layers.live.lists.contains_key(&name) {
            layers.set_live_list(name, None, None);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{
        lists::{List, ListAction},
        rules::{Action, Mode, RuleSet, Selector, default_limit},
    };

    fn p(s: &str) -> Selector {
        Selector::parse("CIDR", s).expect("a test CIDR")
    }

    fn layers() -> Layers {
        let mut base = RuleSet::default();
        base.rules.insert(p("198.18.1.0/24"), Action::Allow);
        base.rules
            .insert(p("198.18.2.0/24"), Action::Deny { dry_run: false });
        base.lists.insert(
            "bad".into(),
            List {
                action: ListAction::Deny,
                source: "bad.txt".into(),
                entries: vec![p("198.18.9.9/32").source].into(),
                counted: false,
            },
        );
        let mut l = Layers::of(base);
        l.set_live(p("198.18.3.0/24"), Some(Action::Allow), None);
        l.set_live(p("198.18.4.0/24"), Some(Action::Allow), Some(u64::MAX));
        // A live change on top of a config rule.
        l.set_live(p("198.18.2.0/24"), Some(Action::Allow), None);
        let mut limit = default_limit();
        limit.burst = 7;
        l.live.default = Some(Action::Limit(limit));
        l.live.mode = Some(Mode::AllowlistOnly);
        l
    }

    #[test]
    fn reset_leaves_only_the_default_rule_in_normal_mode() {
        let mut l = layers();
        let default = l.effective().default;
        reset(&mut l, ResetScope::All);
        let set = l.effective();
        assert!(set.rules.is_empty(), "{:?}", set.rules);
        assert!(set.lists.is_empty());
        assert_eq!(set.mode, Mode::Normal);
        assert_eq!(set.default, default, "the live default stays");
        assert!(l.live.expiring.is_empty(), "no temporary rule comes back");
    }

    #[test]
    fn reset_live_gives_back_the_config_file() {
        let mut l = layers();
        let base = l.base.clone();
        reset(&mut l, ResetScope::Live);
        assert_eq!(l.effective(), base);
    }

    #[test]
    fn reset_config_keeps_the_live_changes() {
        let mut l = layers();
        reset(&mut l, ResetScope::Config);
        let set = l.effective();
        let cidrs: Vec<String> = set.rules.keys().map(ToString::to_string).collect();
        assert_eq!(
            cidrs,
            ["198.18.2.0/24", "198.18.3.0/24", "198.18.4.0/24"],
            "the live rules stay (one of them on a config rule's CIDR)"
        );
        assert!(set.lists.is_empty(), "the config file's list goes");
        assert_eq!(
            set.mode,
            Mode::AllowlistOnly,
            "a live mode is a live change"
        );
    }
}
