"""Proposers: n-gram prompt lookup, a standalone draft model, feature-level heads."""
from .base import Draft, Proposer
from .draft_model import DraftModelProposer
from .ngram import NgramProposer, find_continuation

__all__ = ["Draft", "Proposer", "DraftModelProposer", "NgramProposer", "find_continuation"]
