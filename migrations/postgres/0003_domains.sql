-- Domains registered at run time (UpsertDomain): each row is one native JSON manifest as the
-- client sent it, validated before it was written. The registry a daemon serves is its
-- manifest files plus these rows.
CREATE TABLE domains (
    name       TEXT PRIMARY KEY NOT NULL,
    manifest   TEXT NOT NULL,
    -- Unix milliseconds of the last UpsertDomain of this name.
    updated_at BIGINT NOT NULL
);

-- Every change tells the other daemons to rebuild their registry: one notification per
-- statement, with the writer's application name as payload (each daemon connects under a name
-- of its own, and ignores what it wrote itself).
CREATE OR REPLACE FUNCTION toolrouter_domains_changed() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('toolrouter_domains', current_setting('application_name'));
    RETURN NULL;
END
$$;

CREATE TRIGGER domains_changed
    AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON domains
    FOR EACH STATEMENT EXECUTE FUNCTION toolrouter_domains_changed();
