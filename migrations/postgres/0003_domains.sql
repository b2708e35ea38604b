-- Domains registered at run time (UpsertDomain): each row is one native JSON manifest as the
-- client sent it, validated before it was written. The registry a daemon serves is its
-- manifest files plus these rows.
CREATE TABLE domains (
    name       TEXT PRIMARY KEY NOT NULL,
    manifest   TEXT NOT NULL,
    -- Unix milliseconds of the last UpsertDomain of this name.
    updated_at BIGINT NOT NULL
);

-- Every change tells the other daemons to rebuild their registry (one notification per
-- statement; toolrouter_notify is migration 0001's).
CREATE TRIGGER domains_changed
    AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON domains
    FOR EACH STATEMENT EXECUTE FUNCTION toolrouter_notify('toolrouter_domains');
