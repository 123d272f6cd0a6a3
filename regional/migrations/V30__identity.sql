-- Tenants as records and API keys (issue 24). The global tier writes each
-- record to every region and reads it from a majority; a region keeps the
-- newest version it was sent (the writer's clock in microseconds: last
-- writer wins, and a key's revocation is the last write a key gets).
-- `doc` is the record as the global tier defines it (a tenant, or a key
-- with the SHA-256 of its secret, never the secret).
CREATE TABLE identity_records (
    kind text NOT NULL CHECK (kind IN ('tenant', 'key')),
    id text NOT NULL,
    version bigint NOT NULL,
    doc jsonb NOT NULL,
    -- When a global replica last let the key in (a tenant's: unused).
    last_used_at timestamptz,
    PRIMARY KEY (kind, id)
);
-- A tenant's keys, listed by the tenant or an operator.
CREATE INDEX identity_records_by_tenant ON identity_records (kind, (doc ->> 'tenant'));
