"""Structured output: grammars on the target's distribution (grammar.py) and tool calls (tools.py)."""
