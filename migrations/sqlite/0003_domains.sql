-- Domains registered at run time (UpsertDomain): each row is one native JSON manifest as the
-- client sent it, validated before it was written. The registry a daemon serves is its
-- manifest files plus these rows.
CREATE TABLE domains (
    name       TEXT PRIMARY KEY NOT NULL,
    manifest   TEXT NOT NULL,
    -- Unix milliseconds of the last UpsertDomain of this name.
    updated_at INTEGER NOT NULL
);
