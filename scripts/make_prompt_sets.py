"""Writes the tuning and evaluation prompt sets (assets/prompts/{tune,eval}/<task type>.jsonl).

The rule they serve (docs/usage.md: tuning, evaluation): a prompt that trained, tuned or was looked at while choosing
anything (a template, a constant, a threshold) belongs to the tuning set; the evaluation set is used for the
docs/ figures, nothing else. Both cover the task types a chat app meets: translation, summarization, short
factual questions, math word problems, questions over a pasted document, extraction, everyday chat and multi-turn
chat. The texts are written here by hand; the pasted documents are docstrings of Python's standard library (PSF
licence) read from the running interpreter, so the files are reproducible. The math tuning prompts are the GSM8K
training questions in ../shared/data (read there, not copied); the evaluation set's math problems are new.
"""

from __future__ import annotations

import argparse as _argparse
import csv as _csv
import difflib as _difflib
import heapq as _heapq
import json
import json as _json
import sqlite3 as _sqlite3
from pathlib import Path

OUT = Path(__file__).resolve().parents[1] / "assets" / "prompts"


def doc(module) -> str:
    return " ".join((module.__doc__ or "").split()) if module is not _heapq else " ".join(_heapq.__about__.split())


def user(text: str) -> dict:
    return {"messages": [{"role": "user", "content": text}]}


def chat(*turns: str) -> dict:
    """Alternating user / assistant turns ending with the user's."""
    roles = ["user", "assistant"]
    return {"messages": [{"role": roles[i % 2], "content": t} for i, t in enumerate(turns)]}


EVAL = {
    "translation": [
        user(
            "Translate into French: The train to Lyon leaves at half past seven, so we should be at the station "
            "by seven."
        ),
        user(
            "Translate into Spanish: My grandmother grows tomatoes, beans and peppers in a small garden behind "
            "her house."
        ),
        user("Translate into German: Please close the windows before you leave; it is going to rain tonight."),
        user("Translate this sentence into English: Le musée est fermé le lundi, mais il ouvre plus tard le jeudi."),
    ],
    "summarization": [
        user("Summarize the following text in three sentences.\n\n" + doc(_argparse)),
        user("Summarize the following documentation for a beginner, in a short paragraph.\n\n" + doc(_csv)),
        user("Write a two-sentence summary of this text.\n\n" + doc(_json)),
        user("Summarize the main points of this text as a bulleted list.\n\n" + doc(_sqlite3)),
    ],
    "factual-qa": [
        user("What is the capital of Australia?"),
        user("How many legs does a spider have?"),
        user("Which planet is closest to the Sun?"),
        user("What gas do plants take in from the air to make their food?"),
    ],
    "math": [
        user(
            "A bakery sells muffins for $3 each and cookies for $1.50 each. Maria buys 4 muffins and 6 cookies. "
            "How much does she spend?"
        ),
        user("A train travels 240 kilometres in 3 hours. At the same speed, how far does it travel in 5 hours?"),
        user(
            "Tom has 36 marbles. He gives a third of them to his sister and then buys 10 more. How many marbles "
            "does he have now?"
        ),
        user(
            "A garden is 12 metres long and 8 metres wide. A path 1 metre wide runs all the way around the "
            "outside of it. What is the area of the path?"
        ),
    ],
    "document-qa": [
        user(
            "Read this documentation and answer: which function turns a JSON document into a Python object?\n\n"
            + doc(_json)
        ),
        user(
            "According to the text below, what does the csv module let programmers do without knowing the "
            "details of Excel's format?\n\n" + doc(_csv)
        ),
        user("Based on this text, what does the argparse module generate automatically?\n\n" + doc(_argparse)),
        user("From the documentation below, name one thing the sqlite3 module provides.\n\n" + doc(_sqlite3)),
    ],
    "extraction": [
        user(
            "Extract the name, date and amount from this message as JSON with keys name, date and amount: "
            "'Hi, this is Priya Raman. I paid the invoice of 245.80 euros on 3 March 2026, please confirm.'"
        ),
        user(
            "List every city mentioned in this text, one per line: 'We flew from Oslo to Madrid, took the train "
            "to Valencia, and then spent a week in Lisbon before going home via Paris.'"
        ),
        user(
            "From this order note, extract the product names and quantities as a table: 'Please send 3 blue "
            "notebooks, 12 pencils, 2 staplers and one large whiteboard to the office.'"
        ),
        user(
            "Pull out the phone number and the email address from this text: 'For bookings call 555-0142 or "
            "write to desk@harbourinn.example, we answer within a day.'"
        ),
    ],
    "chat": [
        user("I can't sleep lately. Any tips?"),
        user("What should I cook tonight with rice, eggs and spinach?"),
        user("Can you suggest a name for my new grey cat?"),
        user("I have a job interview tomorrow. How should I prepare this evening?"),
    ],
    "multi-turn": [
        chat(
            "I'm planning a weekend trip to the mountains.",
            "That sounds lovely! Do you plan to hike, or mostly relax?",
            "Mostly hiking. What should I pack?",
        ),
        chat(
            "Give me a short poem about the sea.",
            "The sea rolls in with silver light,\nit hums and hushes through the night.",
            "Now make it rhyme about the moon instead.",
        ),
        chat(
            "What's a good first programming language?",
            "Python is a popular first language: its syntax is readable and it is used almost everywhere.",
            "Why is it considered readable?",
        ),
        chat(
            "Help me write an email to my landlord about a broken heater.",
            "Sure. Do you want it formal or friendly?",
            "Formal, and mention that it has been broken for a week.",
        ),
    ],
}

TUNE = {
    "translation": [
        user("Translate into French: I would like a table for two near the window, please."),
        user("Translate into Spanish: The library opens at nine and closes at six on weekdays."),
        user("Translate into German: We are going to visit our friends in Hamburg next month."),
        user("Translate into Italian: Could you tell me where the nearest pharmacy is?"),
        user("Translate this sentence into English: Der Zug hatte zwanzig Minuten Verspätung wegen des Schnees."),
    ],
    "summarization": [
        user("Summarize the following text in three sentences.\n\n" + doc(_heapq)),
        user("Summarize this documentation in one short paragraph.\n\n" + doc(_difflib)),
        user("Give a bulleted summary of this text.\n\n" + doc(_heapq)[:1500]),
    ],
    "factual-qa": [
        user("What is the largest ocean on Earth?"),
        user("Who wrote the play Romeo and Juliet?"),
        user("How many days are there in a leap year?"),
        user("What is the boiling point of water at sea level in degrees Celsius?"),
        user("Which continent is Kenya in?"),
    ],
    "document-qa": [
        user("Read this text and answer: what is a heap, according to it?\n\n" + doc(_heapq)),
        user("According to this documentation, what does SequenceMatcher compare?\n\n" + doc(_difflib)),
        user("Based on the text below, why are heaps useful for sorting?\n\n" + doc(_heapq)),
    ],
    "extraction": [
        user(
            "Extract the sender, the meeting time and the room from this note as JSON: 'Jonas here - the design "
            "review moved to 14:30 in room B2.'"
        ),
        user(
            "List all the numbers that appear in this sentence: 'The team of 11 players won 3 of their 5 games "
            "and scored 27 goals.'"
        ),
        user(
            "From this recipe line, extract each ingredient and its amount: '200 g flour, 2 eggs, 150 ml milk "
            "and a pinch of salt.'"
        ),
    ],
    "chat": [
        user("How do I keep my houseplants alive?"),
        user("What's a fun thing to do on a rainy Sunday?"),
        user("Can you recommend a good way to start running?"),
        user("My friend's birthday is next week. Gift ideas?"),
    ],
    "multi-turn": [
        chat(
            "I want to learn to cook.",
            "Great! Do you want to start with simple everyday meals?",
            "Yes. What are three easy dishes to start with?",
        ),
        chat("Tell me a fun fact about octopuses.", "Octopuses have three hearts.", "Tell me another one."),
        chat("I need a name for my bakery.", "How about 'Rise & Shine'?", "Something more old-fashioned, please."),
    ],
}


def main() -> None:
    import argparse

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.parse_args()
    for name, sets in (("eval", EVAL), ("tune", TUNE)):
        folder = OUT / name
        folder.mkdir(parents=True, exist_ok=True)
        for task, rows in sets.items():
            with open(folder / f"{task}.jsonl", "w", encoding="utf-8") as fh:
                for i, row in enumerate(rows):
                    fh.write(json.dumps({"id": i + 1, "category": task, **row}, ensure_ascii=False) + "\n")
    print(
        f"wrote {sum(len(v) for v in EVAL.values())} evaluation and {sum(len(v) for v in TUNE.values())} tuning "
        f"prompts under {OUT}"
    )


if __name__ == "__main__":
    main()
