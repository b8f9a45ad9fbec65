"""Saved conversations: SQLite with a versioned schema (db, schema) and checks of what comes from outside."""
