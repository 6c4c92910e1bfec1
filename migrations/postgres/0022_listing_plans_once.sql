-- The listing calls planned once per connection, every statement in them by key (ADR 0058).
--
-- Migration 0015 (ADR 0046) made `wharf_group_summaries`, `wharf_group_view` and
-- `wharf_group_figures` plan their statements on every call (`force_custom_plan`), so that no
-- plan made while a table was small or empty would ever serve them. Planning was then a third
-- of a page's server work (pgbench, one client, 10k groups and 1M events: a summary page 0.97
-- ms a call, 0.57-0.72 planned once; the page of waiting groups 2.0-2.3 against 1.4-1.7; one
-- group 0.82-0.88 against 0.52-0.56; a page's queue figures 1.05-1.14 against 0.81-0.85).
--
-- Here each keeps one plan per connection (`force_generic_plan`), made with every other path
-- than an index off: sequential and bitmap scans, sorts, hash and merge joins, materializing,
-- as `wharf_claim` does since migration 0019 (ADR 0050). Every table each statement reads is
-- reached through an index on its key (the group name, a topic's name, the projector, the log
-- position), and with those paths off the plan's shape no longer follows the statistics: a
-- plan made on empty tables is the plan made on a large store. A sort stays where a statement
-- needs one (the page of waiting groups orders its few rows by name), costed as disabled;
-- `jit = off` keeps such a cost from compiling the statement.
--
-- The statements are unchanged, the texts `tests/tests/listing_calls.rs` checks against the
-- code (`pg_summary_sql`, `PG_GROUP`, `GROUP_FIGURES_SQL`); that test makes each connection's
-- plans on empty tables analyzed empty, fills a 20k-group store and holds every call to its
-- bound of buffers. Only the settings differ from 0015.

-- Superseded by functions/wharf_group_summaries.sql (ADR 0073).

-- include: functions/wharf_group_view.sql fnv1a64=c5abb848a6016566

-- Superseded by functions/wharf_group_figures.sql (ADR 0073).
