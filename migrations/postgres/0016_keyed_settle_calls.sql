-- Acks and claim extensions as calls whose plans are always keyed (ADR 0048).
--
-- `ack`, `ack_many` and `extend` were cached statements: each connection prepares them once,
-- and after a few runs Postgres may settle on a generic plan for good. Made while `delivery`
-- held a handful of rows (a consumer that started on an empty queue, statistics taken then),
-- that plan was a sequential scan, and it stayed one as the queue grew: at 300k deliveries an
-- ack read 4,840 buffers (24 ms), an ack of two 4,840 plus a hash of the whole table spilled to
-- disk (110 ms), an extension 4,840 (22 ms); keyed, each reads a few buffers.
--
-- Each statement now runs inside a function, as the claim does (migration 0013): one round
-- trip through a statement the connection prepares once, planned with sequential scans, bitmap
-- scans, hash joins and merge joins disabled, so the only plans left are primary-key look-ups,
-- one per key (for a batch, a nested loop over the keys). A batch's join is planned on every
-- call with the call's values (`plan_cache_mode = force_custom_plan`): which side of the loop
-- goes first depends on the sizes. The settings hold only while the function runs.
-- `tests/tests/queue_plans.rs` checks each call on a queue that grew to 300k rows after the
-- connection first used it.
--
-- The statements are the ones `queue/src/postgres/claim.rs` sent before, unchanged.

-- include: functions/wharf_settle.sql fnv1a64=c07bbe45599e392f

-- include: functions/wharf_ack.sql fnv1a64=28766d5afdf1c057

-- include: functions/wharf_extend.sql fnv1a64=3add6c92d3a575c2
