-- Per-conversation state: the groups loaded explicitly and the domains hit by keywords, in the
-- order they joined the conversation (seq), so the tool order stays stable across turns.
CREATE TABLE conversations (
    id        TEXT PRIMARY KEY NOT NULL,
    -- Unix milliseconds of the last Route or LoadToolGroup call (flushed lazily).
    last_seen INTEGER NOT NULL
);

CREATE TABLE conversation_domains (
    conversation_id TEXT NOT NULL,
    domain          TEXT NOT NULL,
    -- Join order within the conversation; ties (same turn) are broken by domain name.
    seq             INTEGER NOT NULL,
    loaded          INTEGER NOT NULL CHECK (loaded IN (0, 1)),
    hit             INTEGER NOT NULL CHECK (hit IN (0, 1)),
    PRIMARY KEY (conversation_id, domain)
);
