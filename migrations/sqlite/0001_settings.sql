-- Settings written by settings UIs; a domain is active when one of its settings keys has a
-- non-blank value here.
CREATE TABLE IF NOT EXISTS settings (
    key   TEXT PRIMARY KEY NOT NULL,
    value TEXT NOT NULL
);
