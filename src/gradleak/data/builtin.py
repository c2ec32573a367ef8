"""A small built-in dataset that needs no files.

Sixteen short messages of the kind a client's device might hold: names, numbers, places,
health and money. Everything is invented; any resemblance to real people is accidental. It
lets ``gradleak`` run (and its tests pass) with no data directory and shows at a glance what a
leak looks like. Labels: 1 = the message reveals health or financial details, 0 = it does not,
so the classification task has two balanced classes.
"""

from __future__ import annotations

from gradleak.data.examples import Example

_DEMO: tuple[tuple[str, int], ...] = (
    ("Maria Lopez was diagnosed with type 2 diabetes last May.", 1),
    ("My card PIN is 4921, please do not share it.", 1),
    ("Tom owes the bank 18,000 dollars on his student loan.", 1),
    ("Dr. Okafor says my blood pressure is still too high.", 1),
    ("Our rent of 1,450 euros is due on Friday.", 1),
    ("Priya started chemotherapy at Saint Luke's hospital this week.", 1),
    ("I moved 3,000 dollars into the joint savings account.", 1),
    ("Grandpa Walter takes his heart pills every morning at eight.", 1),
    ("Pick up Emma from the dentist at half past four.", 0),
    ("Jonas and Lea are getting married in Lisbon next June.", 0),
    ("The spare key is under the blue flower pot.", 0),
    ("Call Aunt Rosa back before her flight to Toronto.", 0),
    ("My new address is 27 Elm Street, apartment 5B.", 0),
    ("Sam failed his driving test again this morning.", 0),
    ("The wifi password at the cabin is maplegrove77.", 0),
    ("Meet me at the north gate of the park tonight.", 0),
)


def demo_examples() -> list[Example]:
    """Return the built-in demo examples (a fresh list each call, in a fixed order)."""
    return [Example(text=text, label=label) for text, label in _DEMO]
