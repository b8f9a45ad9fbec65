"""The conversation database's schema, versioned with PRAGMA user_version, and the steps from one version to the next.

Version 1 (the first released schema): conversations, messages, tokens (one row per emitted token).
Version 2: messages.error (why an answer stopped with finish_reason 'error'), tokens.rejected_p_target /
tokens.rejected_p_draft / tokens.extra (any further TokenEvent fields, as JSON), and the indexes the
conversation list and the reopen path read through.
Version 3: messages.sampling (the answer's sampling settings as JSON, so "compare with baseline" can repeat a
reopened answer).
Version 4: messages.tree_nodes (the size of the token trees an answer drafted; NULL or 0: chains of K).
Version 5: conversations.system_prompt (the system message its answers were given; NULL in a conversation saved
before: none) and settings (the window's saved defaults, such as the default system prompt, one row per key).
Version 6: the messages of a conversation form a tree, so every version of an edited message or a regenerated answer
is kept: messages.parent_id (the message it follows; NULL: a first message) and messages.shown (when it was last on
the shown path; the path follows the most recently shown child at each step). A v5 conversation becomes one chain,
each message following the one before it, all of it shown.

A migration is a list of SQL statements run in one transaction together with the user_version bump, so a
crash during an upgrade leaves the file at the old version, never half-way.
"""

from __future__ import annotations

import sqlite3

V1 = [
    """CREATE TABLE conversations (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        title TEXT NOT NULL,
        model TEXT NOT NULL,
        created_at REAL NOT NULL,
        updated_at REAL NOT NULL
    )""",
    """CREATE TABLE messages (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        conversation_id INTEGER NOT NULL REFERENCES conversations(id) ON DELETE CASCADE,
        role TEXT NOT NULL,
        content TEXT NOT NULL,
        complete INTEGER NOT NULL,
        model TEXT,
        proposer TEXT,
        k INTEGER,
        finish_reason TEXT,
        stats TEXT,
        created_at REAL NOT NULL
    )""",
    """CREATE TABLE tokens (
        message_id INTEGER NOT NULL REFERENCES messages(id) ON DELETE CASCADE,
        seq INTEGER NOT NULL,
        token_id INTEGER NOT NULL,
        text TEXT NOT NULL,
        kind TEXT NOT NULL,
        p_target REAL,
        p_draft REAL,
        rejected_id INTEGER,
        PRIMARY KEY (message_id, seq)
    )""",
]

V2 = [
    "ALTER TABLE messages ADD COLUMN error TEXT",
    "ALTER TABLE tokens ADD COLUMN rejected_p_target REAL",
    "ALTER TABLE tokens ADD COLUMN rejected_p_draft REAL",
    "ALTER TABLE tokens ADD COLUMN extra TEXT",
    "CREATE INDEX IF NOT EXISTS messages_by_conversation ON messages(conversation_id, id)",
    "CREATE INDEX IF NOT EXISTS conversations_by_update ON conversations(updated_at DESC, id DESC)",
]

V3 = ["ALTER TABLE messages ADD COLUMN sampling TEXT"]

V4 = ["ALTER TABLE messages ADD COLUMN tree_nodes INTEGER"]

V5 = [
    "ALTER TABLE conversations ADD COLUMN system_prompt TEXT",
    "CREATE TABLE settings (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
]

V6 = [
    "ALTER TABLE messages ADD COLUMN parent_id INTEGER REFERENCES messages(id) ON DELETE CASCADE",
    "ALTER TABLE messages ADD COLUMN shown INTEGER NOT NULL DEFAULT 0",
    "UPDATE messages SET parent_id = (SELECT MAX(p.id) FROM messages p "
    "WHERE p.conversation_id = messages.conversation_id AND p.id < messages.id), shown = id",
    "CREATE INDEX IF NOT EXISTS messages_by_parent ON messages(parent_id)",
]

# MIGRATIONS[n] takes a database from version n to version n + 1 (version 0 = an empty file).
MIGRATIONS: list[list[str]] = [V1, V2, V3, V4, V5, V6]
SCHEMA_VERSION = len(MIGRATIONS)


def user_version(conn: sqlite3.Connection) -> int:
    return int(conn.execute("PRAGMA user_version").fetchone()[0])


def migrate(conn: sqlite3.Connection, target_version: int = SCHEMA_VERSION) -> int:
    """Bring the database up to target_version, one transaction per step. Returns the version found at the start.

    conn must be in autocommit mode (isolation_level=None), so BEGIN/COMMIT here are the only transaction bounds.
    """
    found = user_version(conn)
    for version in range(found, target_version):
        conn.execute("BEGIN IMMEDIATE")
        try:
            if user_version(conn) != version:  # another process migrated while we waited for the lock
                conn.execute("ROLLBACK")
                continue
            for statement in MIGRATIONS[version]:
                conn.execute(statement)
            conn.execute(f"PRAGMA user_version = {version + 1}")
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
    return found
