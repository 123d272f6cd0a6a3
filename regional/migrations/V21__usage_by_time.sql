-- The usage ledger in time order (docs/billing.md, "Reading it"):
-- `GET /v1/admin/usage/records?order=time` pages the rows by
-- (started_at, usage_id), a keyset the billing export reads hour by hour
-- (every row lies within one clock hour), pricing each hour as it is read
-- instead of holding the month.
CREATE INDEX usage_ledger_by_start ON usage_ledger (started_at, usage_id);
