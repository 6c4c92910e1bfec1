-- Listing reads as cached calls (ADR 0046): a page of group summaries, one group's view and
-- the queue figures of a page are each one call of a function, through a statement each
-- connection prepares once: one round trip, no parse. Each function holds the statement (or,
-- for a page, the four forms of it) the code sent unnamed before, unchanged, and plans it on
-- every call with the call's values and the tables as they are then (`plan_cache_mode =
-- force_custom_plan`): no generic plan made while a table was small or empty ever serves it
-- (ADR 0007, 0024, 0042). It caches the parsed statement only.
--
-- JIT compilation is off inside them: a page's statements take a few milliseconds, and on a
-- store whose statistics are stale the planner's cost estimates passed `jit_above_cost`, so
-- Postgres compiled the queue figures' statement on every call (about 30 ms of LLVM work for
-- a statement that runs in 2-4 ms; `docs/benchmarks.md`, "Listing reads as cached calls").
-- Bitmap scans are off too: per group each probe reads a few rows by key, where a bitmap is
-- built and torn down per group.
--
-- The statements are the ones in `projections/src/summary.rs` (`pg_summary_sql`),
-- `projections/src/rows.rs` (`PG_GROUP`) and `queue/src/postgres/stats.rs`
-- (`GROUP_FIGURES_SQL`): the plan tests (`tests/tests/read_plans.rs`) check those texts, and
-- a test checks that each function runs exactly them (whitespace aside). A change to one is a
-- new migration that replaces the function.

-- Superseded by functions/wharf_group_summaries.sql (ADR 0073).

-- Superseded by functions/wharf_group_view.sql (ADR 0073).

-- Superseded by functions/wharf_group_figures.sql (ADR 0073).
