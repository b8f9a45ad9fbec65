"""Proposers: n-gram prompt lookup, a standalone draft model, feature-level heads, and lookup-then-head."""

from .base import Draft, Proposer
from .draft_model import DraftModelProposer
from .lookup_first import LookupFirstProposer
from .ngram import NgramProposer, find_continuation

__all__ = ["Draft", "Proposer", "DraftModelProposer", "LookupFirstProposer", "NgramProposer", "find_continuation"]
