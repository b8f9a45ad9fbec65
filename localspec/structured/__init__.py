"""Structured output: grammars on the target's distribution (grammar.py), tool calls (tools.py) and stop strings
(stops.py)."""
