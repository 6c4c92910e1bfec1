-- Room on each page of `managed_filter` for a newer version of its rows (ADR 0031). A SUBACK
-- record updates every row a Remember just inserted; with full pages each new version went to
-- another page and needed a new primary-key entry, which was most of the record's cost (10,000
-- filters: ~120 ms of ~175 ms). With half of each page free the update stays on the page (a
-- HOT update, no index entry). Only pages written from now on get the room. Additive.
ALTER TABLE managed_filter SET (fillfactor = 50);
