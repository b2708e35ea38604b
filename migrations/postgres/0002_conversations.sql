-- Per-conversation state: the groups loaded explicitly and the domains hit by keywords, in the
-- order they joined the conversation (seq), so the tool order stays stable across turns.
-- Several daemons share these rows; each caches conversations in memory and checks a
-- conversation's version before trusting its copy.

-- Versions come from one sequence, so a conversation deleted and written again never
-- repeats a version a daemon may still hold.
CREATE SEQUENCE conversation_versions;

CREATE TABLE conversations (
    id        TEXT PRIMARY KEY NOT NULL,
    -- Unix milliseconds of the latest Route or LoadToolGroup call any daemon recorded
    -- (flushed lazily; it only moves forward).
    last_seen BIGINT NOT NULL,
    -- Bumped by every write of the conversation's domains.
    version   BIGINT NOT NULL,
    -- The version the last write replaced (NULL when it created the row): a writer whose
    -- copy was older than that has missed another daemon's write and re-reads.
    previous  BIGINT
);

CREATE INDEX conversations_last_seen ON conversations (last_seen);

CREATE TABLE conversation_domains (
    conversation_id TEXT NOT NULL REFERENCES conversations (id) ON DELETE CASCADE,
    domain          TEXT NOT NULL,
    -- Join order within the conversation; ties (same turn) are broken by domain name.
    seq             BIGINT NOT NULL,
    loaded          BOOLEAN NOT NULL,
    hit             BOOLEAN NOT NULL,
    PRIMARY KEY (conversation_id, domain)
);
