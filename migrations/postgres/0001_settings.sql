-- Settings written by settings UIs; a domain is active when one of its settings keys has a
-- non-blank value here.
CREATE TABLE IF NOT EXISTS settings (
    key   TEXT PRIMARY KEY NOT NULL,
    value TEXT NOT NULL
);

-- Notifies the channel named by the trigger's argument when its table changes, with the
-- writer's application name as payload (each daemon connects under a name of its own and
-- ignores what it wrote itself). Sent when the transaction commits; PostgreSQL folds a
-- transaction's identical notifications into one.
CREATE OR REPLACE FUNCTION toolrouter_notify() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify(TG_ARGV[0], current_setting('application_name'));
    RETURN NULL;
END
$$;

-- Any change to the table, by anyone, tells every listening daemon to re-read the whole
-- snapshot: one notification per statement. A daemon's InvalidateSettings sends the same
-- notification.
CREATE TRIGGER settings_changed
    AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON settings
    FOR EACH STATEMENT EXECUTE FUNCTION toolrouter_notify('toolrouter_settings');
