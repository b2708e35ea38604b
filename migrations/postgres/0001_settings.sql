-- Settings written by settings UIs; a domain is active when one of its settings keys has a
-- non-blank value here.
CREATE TABLE IF NOT EXISTS settings (
    key   TEXT PRIMARY KEY NOT NULL,
    value TEXT NOT NULL
);

-- Any change to the table, by anyone, tells every listening daemon to re-read the whole
-- snapshot. One notification per statement, sent when its transaction commits (PostgreSQL
-- folds a transaction's identical notifications into one). The daemons' own
-- InvalidateSettings sends the same notification with the sender as payload.
CREATE OR REPLACE FUNCTION toolrouter_settings_changed() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('toolrouter_settings', '');
    RETURN NULL;
END
$$;

CREATE TRIGGER settings_changed
    AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON settings
    FOR EACH STATEMENT EXECUTE FUNCTION toolrouter_settings_changed();
