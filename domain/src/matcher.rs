//! Routing a subject to a consumer group: does any of the group's filters match it?
//!
//! Semantics follow MQTT v5 section 4.7:
//!
//! * `#` is always the last level and matches its parent level as well as everything below it
//!   (`a/#` matches `a`, `a/b` and `a/b/c`);
//! * `+` matches exactly one level, which may be empty (`a/+` matches `a/` and `a/x`, but neither
//!   `a` nor `a/x/y`);
//! * empty levels are levels like any other (`a//b` has three);
//! * a filter whose first level is a wildcard does not match a subject whose first level starts
//!   with `$` (`#` and `+/x` skip `$SYS/x`; `$SYS/#` matches it).
//!
//! [`BindingMatcher`] is the fast path: a trie of all of a group's filters, walked once along the
//! subject's levels. [`filter_matches`] is the plain one-filter comparison it is tested against.

use std::collections::HashMap;

use crate::binding_set::BindingSet;
use crate::filter::{Subject, TopicFilter};

/// Matches subjects against a whole binding set at once.
///
/// Built once per binding set; matching walks a trie along the subject's levels, so its cost
/// depends on the subject and on how many filters share its prefixes, never on how many
/// unrelated filters the set holds. A match allocates nothing in ordinary use (a scratch stack
/// spills to the heap only when more than a few dozen `+` alternatives are pending at once).
///
/// **An empty binding set means "the whole topic"**: the group consumes every message of its
/// topic, so such a matcher matches every subject, including subjects starting with `$`. That is
/// a rule about what a group with no bindings receives, not an MQTT wildcard; a group that binds
/// `#` explicitly gets MQTT's behaviour and does not see `$` subjects.
#[derive(Debug, Clone, Default)]
pub struct BindingMatcher {
    root: Node,
    whole_topic: bool,
}

/// One level of the trie: reached by following the levels of a filter prefix.
#[derive(Debug, Clone, Default)]
struct Node {
    /// Children for literal levels (including the empty level).
    literals: HashMap<String, Node>,
    /// The child for a `+` level.
    any_one: Option<Box<Node>>,
    /// A filter ends exactly at this node.
    ends_here: bool,
    /// A filter continues with `#` after this node: everything from here down matches,
    /// this level included.
    any_rest: bool,
}

impl BindingMatcher {
    /// Builds the matcher for `set`. An empty set matches every subject (whole topic).
    pub fn new(set: &BindingSet) -> Self {
        let mut root = Node::default();
        for filter in set.filters() {
            root.insert(filter);
        }
        Self {
            root,
            whole_topic: set.is_whole_topic(),
        }
    }

    /// True when the matcher was built from the whole-topic (empty) set.
    pub fn is_whole_topic(&self) -> bool {
        self.whole_topic
    }

    /// True when any filter of the set matches `subject` (always, for the whole-topic set).
    pub fn matches(&self, subject: &Subject) -> bool {
        self.matches_str(subject.as_str())
    }

    /// As [`BindingMatcher::matches`], for a subject the caller has already validated as a topic
    /// name. Given text that is not one (holding `+` or `#`, say), the result is merely some
    /// boolean: those characters are compared as plain text.
    pub fn matches_str(&self, subject: &str) -> bool {
        if self.whole_topic {
            return true;
        }
        // Wildcards in a filter's first level do not reach `$` subjects.
        let root_wildcards = !subject.starts_with('$');
        let mut pending = Pending::new();
        let mut node = &self.root;
        let mut rest = Some(subject);
        let mut wildcards = root_wildcards;
        loop {
            if let Some(found) = step(node, rest, wildcards, &mut pending) {
                match found {
                    Step::Matched => return true,
                    Step::Descend(next, tail) => {
                        node = next;
                        rest = tail;
                        wildcards = true;
                        continue;
                    }
                }
            }
            match pending.pop() {
                Some((next, tail)) => {
                    node = next;
                    rest = tail;
                    wildcards = true;
                }
                None => return false,
            }
        }
    }
}

impl Node {
    fn insert(&mut self, filter: &TopicFilter) {
        let mut node = self;
        for level in filter.levels() {
            match level {
                // Validation guarantees `#` is the last level.
                "#" => {
                    node.any_rest = true;
                    return;
                }
                "+" => node = node.any_one.get_or_insert_with(Box::default),
                literal => node = node.literals.entry(literal.to_owned()).or_default(),
            }
        }
        node.ends_here = true;
    }
}

/// What one step of the walk found.
enum Step<'t, 's> {
    /// A filter matches the subject.
    Matched,
    /// Continue at this node with these remaining levels.
    Descend(&'t Node, Option<&'s str>),
}

/// Examines `node` with the subject levels still to match (`None`: all consumed). Returns `None`
/// when this branch cannot match. When both a literal and a `+` child fit the next level, the
/// literal one is followed and the `+` one is left on `pending`.
fn step<'t, 's>(
    node: &'t Node,
    rest: Option<&'s str>,
    wildcards: bool,
    pending: &mut Pending<'t, 's>,
) -> Option<Step<'t, 's>> {
    let Some(rest) = rest else {
        // All levels consumed: a filter ending here matches, and so does `#` at this point,
        // since it matches its parent level.
        return (node.ends_here || (wildcards && node.any_rest)).then_some(Step::Matched);
    };
    if wildcards && node.any_rest {
        return Some(Step::Matched);
    }
    let (level, tail) = match rest.split_once('/') {
        Some((level, tail)) => (level, Some(tail)),
        None => (rest, None),
    };
    let literal = node.literals.get(level);
    let any_one = if wildcards {
        node.any_one.as_deref()
    } else {
        None
    };
    match (literal, any_one) {
        (Some(literal), Some(any_one)) => {
            pending.push((any_one, tail));
            Some(Step::Descend(literal, tail))
        }
        (Some(next), None) | (None, Some(next)) => Some(Step::Descend(next, tail)),
        (None, None) => None,
    }
}

/// How many alternatives the walk keeps on the call stack before spilling to the heap.
const INLINE_PENDING: usize = 32;

type Alternative<'t, 's> = (&'t Node, Option<&'s str>);

/// A LIFO of `+` alternatives still to try: a fixed array first, a vector beyond it. Keeps the
/// walk free of both allocation (in any realistic set) and recursion (in any set at all).
struct Pending<'t, 's> {
    inline: [Option<Alternative<'t, 's>>; INLINE_PENDING],
    len: usize,
    spilled: Vec<Alternative<'t, 's>>,
}

impl<'t, 's> Pending<'t, 's> {
    fn new() -> Self {
        Self {
            inline: [None; INLINE_PENDING],
            len: 0,
            spilled: Vec::new(),
        }
    }

    fn push(&mut self, alternative: Alternative<'t, 's>) {
        if self.len < INLINE_PENDING {
            self.inline[self.len] = Some(alternative);
            self.len += 1;
        } else {
            self.spilled.push(alternative);
        }
    }

    fn pop(&mut self) -> Option<Alternative<'t, 's>> {
        // The vector is only used once the array is full, so its entries are the newest.
        if let Some(alternative) = self.spilled.pop() {
            return Some(alternative);
        }
        if self.len == 0 {
            return None;
        }
        self.len -= 1;
        self.inline[self.len].take()
    }
}

/// The plain reference check: does `filter` match the topic name `subject`?
///
/// Compares level by level, one filter at a time: straightforward, and slow across a large set.
/// It is the oracle [`BindingMatcher`] is tested against.
pub fn filter_matches(filter: &TopicFilter, subject: &str) -> bool {
    filter_text_matches(filter.as_str(), subject)
}

/// [`filter_matches`] on the text of a filter already validated as a [`TopicFilter`].
pub(crate) fn filter_text_matches(filter: &str, subject: &str) -> bool {
    let mut filter_levels = filter.split('/').peekable();
    if subject.starts_with('$') && matches!(filter_levels.peek(), Some(&("+" | "#"))) {
        return false;
    }
    let mut subject_levels = subject.split('/');
    loop {
        match (filter_levels.next(), subject_levels.next()) {
            // `#` takes the rest, including nothing at all (the parent level).
            (Some("#"), _) => return true,
            (Some("+"), Some(_)) => {}
            (Some(wanted), Some(got)) if wanted == got => {}
            (None, None) => return true,
            _ => return false,
        }
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn set_of(patterns: &[&str]) -> BindingSet {
        BindingSet::parse(patterns).expect("test patterns are valid filters")
    }

    fn filter(pattern: &str) -> TopicFilter {
        TopicFilter::parse("pattern", pattern).expect("test pattern is a valid filter")
    }

    fn subject(text: &str) -> Subject {
        Subject::parse("subject", text).expect("test subject is a valid topic name")
    }

    /// Asserts that `pattern` matches `topic`, through both the trie and the reference check.
    fn assert_matches(pattern: &str, topic: &str) {
        assert!(
            filter_matches(&filter(pattern), topic),
            "reference: {pattern:?} should match {topic:?}"
        );
        assert!(
            BindingMatcher::new(&set_of(&[pattern])).matches(&subject(topic)),
            "trie: {pattern:?} should match {topic:?}"
        );
    }

    /// Asserts that `pattern` does not match `topic`, through both matchers.
    fn assert_misses(pattern: &str, topic: &str) {
        assert!(
            !filter_matches(&filter(pattern), topic),
            "reference: {pattern:?} should not match {topic:?}"
        );
        assert!(
            !BindingMatcher::new(&set_of(&[pattern])).matches(&subject(topic)),
            "trie: {pattern:?} should not match {topic:?}"
        );
    }

    #[test]
    fn literal_filter_matches_only_the_same_topic() {
        assert_matches("a/b", "a/b");
        assert_misses("a/b", "a");
        assert_misses("a/b", "a/b/c");
        assert_misses("a/b", "a/c");
    }

    #[test]
    fn levels_are_case_sensitive() {
        assert_misses("Sport", "sport");
    }

    #[test]
    fn hash_matches_the_parent_level() {
        assert_matches("a/#", "a");
    }

    #[test]
    fn hash_matches_any_depth_below() {
        assert_matches("a/#", "a/b");
        assert_matches("a/#", "a/b/c");
        assert_matches("a/#", "a/");
    }

    #[test]
    fn hash_does_not_match_a_sibling_or_a_longer_level_name() {
        assert_misses("a/#", "b");
        assert_misses("a/#", "ab");
        assert_misses("a/#", "ab/c");
    }

    #[test]
    fn lone_hash_matches_every_ordinary_topic() {
        assert_matches("#", "a");
        assert_matches("#", "a/b/c");
        assert_matches("#", "/");
        assert_matches("#", "a/$b");
    }

    #[test]
    fn plus_matches_exactly_one_level() {
        assert_matches("a/+", "a/x");
        assert_misses("a/+", "a");
        assert_misses("a/+", "a/x/y");
    }

    #[test]
    fn plus_matches_an_empty_level() {
        assert_matches("a/+", "a/");
        assert_matches("+/b", "/b");
        assert_matches("a/+/b", "a//b");
    }

    #[test]
    fn plus_then_hash_needs_the_plus_level() {
        assert_matches("a/+/#", "a/x");
        assert_matches("a/+/#", "a/x/y/z");
        assert_misses("a/+/#", "a");
    }

    #[test]
    fn empty_levels_are_real_levels() {
        assert_matches("a//b", "a//b");
        assert_misses("a//b", "a/b");
        assert_misses("a/b", "a//b");
        assert_matches("/a", "/a");
        assert_misses("/a", "a");
        assert_misses("a", "a/");
    }

    #[test]
    fn lone_hash_skips_dollar_topics() {
        assert_misses("#", "$SYS");
        assert_misses("#", "$SYS/x");
    }

    #[test]
    fn leading_plus_skips_dollar_topics() {
        assert_misses("+", "$SYS");
        assert_misses("+/x", "$SYS/x");
        assert_misses("+/#", "$SYS/x");
    }

    #[test]
    fn dollar_filters_match_dollar_topics() {
        assert_matches("$SYS/#", "$SYS");
        assert_matches("$SYS/#", "$SYS/x");
        assert_matches("$SYS/+", "$SYS/x");
        assert_matches("$SYS", "$SYS");
    }

    #[test]
    fn dollar_rule_applies_to_the_first_level_only() {
        assert_matches("a/+", "a/$x");
        assert_matches("a/#", "a/$x/y");
        assert_matches("+/$x", "a/$x");
    }

    #[test]
    fn spec_hash_example_matches_parent_and_descendants() {
        let pattern = "sport/tennis/player1/#";
        assert_matches(pattern, "sport/tennis/player1");
        assert_matches(pattern, "sport/tennis/player1/ranking");
        assert_matches(pattern, "sport/tennis/player1/score/wimbledon");
    }

    #[test]
    fn spec_sport_hash_matches_sport() {
        assert_matches("sport/#", "sport");
    }

    #[test]
    fn spec_plus_example_matches_one_level_only() {
        assert_matches("sport/tennis/+", "sport/tennis/player1");
        assert_misses("sport/tennis/+", "sport/tennis/player1/ranking");
    }

    #[test]
    fn spec_sport_plus_needs_a_second_level_which_may_be_empty() {
        assert_misses("sport/+", "sport");
        assert_matches("sport/+", "sport/");
    }

    #[test]
    fn spec_leading_plus_does_not_match_sys_topic() {
        assert_misses("+/monitor/Clients", "$SYS/monitor/Clients");
    }

    #[test]
    fn spec_sys_monitor_plus_matches_sys_topic() {
        assert_matches("$SYS/monitor/+", "$SYS/monitor/Clients");
    }

    #[test]
    fn whole_topic_set_matches_everything_including_dollar_topics() {
        let matcher = BindingMatcher::new(&BindingSet::whole_topic());
        assert!(matcher.is_whole_topic());
        for topic in ["a", "a/b/c", "a//b", "/", "$SYS", "$SYS/monitor/Clients"] {
            assert!(matcher.matches(&subject(topic)), "{topic}");
        }
    }

    #[test]
    fn explicit_hash_set_is_not_whole_topic() {
        let matcher = BindingMatcher::new(&set_of(&["#"]));
        assert!(!matcher.is_whole_topic());
        assert!(matcher.matches(&subject("a/b")));
        assert!(!matcher.matches(&subject("$SYS/x")));
    }

    #[test]
    fn set_matches_when_any_filter_does() {
        let matcher = BindingMatcher::new(&set_of(&["orders/+/created", "alerts/#", "ping"]));
        assert!(matcher.matches(&subject("orders/eu/created")));
        assert!(matcher.matches(&subject("alerts")));
        assert!(matcher.matches(&subject("alerts/disk/full")));
        assert!(matcher.matches(&subject("ping")));
        assert!(!matcher.matches(&subject("orders/eu/deleted")));
        assert!(!matcher.matches(&subject("pong")));
        assert!(!matcher.matches(&subject("ping/x")));
    }

    #[test]
    fn walk_falls_back_from_a_literal_branch_to_plus() {
        // `a/b` leads into a literal branch that fails at `d`; only `a/+/d` matches.
        let matcher = BindingMatcher::new(&set_of(&["a/b/c", "a/+/d"]));
        assert!(matcher.matches(&subject("a/b/d")));
        assert!(matcher.matches(&subject("a/b/c")));
        assert!(!matcher.matches(&subject("a/b/e")));
    }

    #[test]
    fn walk_handles_more_pending_alternatives_than_fit_inline() {
        // Every prefix a, a/a, a/a/a, ... has both a literal `a` child and a `+` child, so the
        // walk down the literal path leaves one alternative per level behind, far more than the
        // inline capacity; only the very first one (`+/#` at the root) matches.
        let depth = INLINE_PENDING * 3;
        let mut patterns: Vec<String> = (0..depth)
            .map(|k| {
                let mut levels = vec!["a"; k];
                levels.extend(["+", "x"]);
                levels.join("/")
            })
            .collect();
        patterns.push(vec!["a"; depth].join("/"));
        patterns.push("+/#".to_owned());
        let set = BindingSet::parse(&patterns).expect("valid filters");
        let matcher = BindingMatcher::new(&set);

        let topic = format!("{}/z", vec!["a"; depth].join("/"));
        assert!(matcher.matches_str(&topic));
        assert!(set.filters().iter().any(|f| filter_matches(f, &topic)));

        let without_root_hash = BindingSet::from_filters(
            set.filters()
                .iter()
                .filter(|f| f.as_str() != "+/#")
                .cloned()
                .collect(),
        );
        assert!(!BindingMatcher::new(&without_root_hash).matches_str(&topic));
    }

    #[test]
    fn matches_and_matches_str_agree() {
        let matcher = BindingMatcher::new(&set_of(&["a/+", "$SYS/#"]));
        for topic in ["a/x", "a", "$SYS/x", "b"] {
            assert_eq!(matcher.matches(&subject(topic)), matcher.matches_str(topic));
        }
    }

    /// Levels the generated filters and subjects are built from: small enough that random sets
    /// and subjects collide often, with an empty level and a `$` level in the mix.
    const LEVELS: [&str; 4] = ["a", "b", "$s", ""];

    fn filter_strategy() -> impl Strategy<Value = TopicFilter> {
        let level = prop_oneof![
            4 => proptest::sample::select(LEVELS.to_vec()),
            1 => Just("+"),
        ];
        (proptest::collection::vec(level, 0..5), any::<bool>()).prop_filter_map(
            "not a valid filter",
            |(mut levels, trailing_hash)| {
                if trailing_hash {
                    levels.push("#");
                }
                TopicFilter::parse("pattern", &levels.join("/")).ok()
            },
        )
    }

    fn subject_strategy() -> impl Strategy<Value = Subject> {
        proptest::collection::vec(proptest::sample::select(LEVELS.to_vec()), 1..6)
            .prop_filter_map("not a valid subject", |levels| {
                Subject::parse("subject", &levels.join("/")).ok()
            })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]

        #[test]
        fn trie_agrees_with_the_reference(
            filters in proptest::collection::vec(filter_strategy(), 0..40),
            subjects in proptest::collection::vec(subject_strategy(), 1..8),
        ) {
            let set = BindingSet::from_filters(filters);
            let matcher = BindingMatcher::new(&set);
            for topic in &subjects {
                let expected = set.is_whole_topic()
                    || set.filters().iter().any(|f| filter_matches(f, topic.as_str()));
                prop_assert_eq!(
                    matcher.matches(topic),
                    expected,
                    "set {} subject {:?}",
                    set,
                    topic.as_str()
                );
            }
        }
    }
}
