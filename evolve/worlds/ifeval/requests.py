"""The base requests generated training prompts are built on: writing tasks of everyday kinds
(stories, letters, explanations, reviews, ...) about subjects drawn from a list, written for this
project. None is taken from IFEval's prompts; ``tests/worlds/test_ifeval.py`` checks that
no generated prompt equals or nearly duplicates one of them.

:func:`request` draws one: ``(text, kind)``, with ``kind`` ``"question"`` for the yes/no questions
that a ``detectable_format:constrained_response`` instruction needs and ``"task"`` otherwise.
"""

from __future__ import annotations

import random

SUBJECTS = (
    "a lighthouse keeper who collects seashells", "urban beekeeping", "the first day at a new job",
    "learning to play the cello as an adult", "a bakery that only opens at night", "tide pools",
    "the history of the bicycle", "a robot that wants to be a gardener", "saving money on groceries",
    "a town where it never stops snowing", "composting at home", "the invention of the printing press",
    "a dragon who is afraid of heights", "remote work", "volcanoes", "a lost library book",
    "public libraries", "the migration of monarch butterflies", "a chess club for seniors",
    "street food in a busy city", "renewable energy for small farms", "the moon landing",
    "a friendship between a cat and a crow", "training for a first marathon", "coral reefs",
    "a time traveler stuck in the year 1850", "houseplants that are hard to kill", "the water cycle",
    "a detective who solves crimes with smells", "recycling electronics", "penguins",
    "a community garden", "learning a second language", "the rings of Saturn", "a haunted bookstore",
    "sleep and memory", "the life of a honeybee", "a family road trip", "making sourdough bread",
    "a mountain village without cars", "digital privacy", "the Great Barrier Reef", "a kite festival",
    "an inventor who builds flying umbrellas", "board games on rainy days", "the deep sea",
    "a mail carrier on a remote island", "healthy breakfast ideas", "the speed of light",
    "a choir of retired firefighters", "cleaning up a local river", "hummingbirds",
    "a submarine made of glass", "the first computer programmers", "a neighborhood bake sale",
    "learning to code", "glaciers", "a painter who can only use the color blue", "electric cars",
    "the history of tea", "a puppy's first snow", "starting a small business", "the northern lights",
    "a clockmaker's apprentice", "public transportation", "octopuses", "a summer camp for inventors",
    "reducing food waste", "ancient Roman roads", "a musician who lost her voice", "solar panels",
    "desert plants", "a school trip to a planetarium", "kindness to strangers", "thunderstorms",
    "a knight who prefers poetry to fighting", "budget travel", "the human heart", "a talking tree",
    "a new smartphone app for birdwatchers", "wind turbines", "the invention of the telephone",
    "a small-town newspaper", "meditation for beginners", "wolves in the wild", "a floating market",
    "the benefits of walking", "a spaceship crew that runs out of coffee", "old maps", "rainforests",
    "a grandmother's secret recipe", "video games and learning", "earthquakes", "a jazz club",
    "the first snowfall of the year", "volunteering at an animal shelter", "the history of chocolate",
    "a bridge that sings when the wind blows", "time management for students", "sea turtles",
    "a robot chef", "night skies in the countryside", "the invention of paper", "a stray dog",
    "a museum of forgotten inventions", "handwriting versus typing", "mushrooms in the forest",
    "a marathon run in the rain", "building a treehouse", "the history of the calendar",
)

AUDIENCES = ("a ten-year-old", "a group of retirees", "a busy parent", "a first-year university student",
             "a tourist", "a new employee", "a farmer", "a software engineer", "a high school class")
RECIPIENTS = ("your landlord", "a former teacher", "your team at work", "a city council member", "an old friend",
              "a hotel manager", "your neighbor", "a customer", "the editor of a local paper")
PRODUCTS = ("a solar-powered backpack", "a self-watering flower pot", "noise-cancelling earmuffs for dogs",
            "a folding electric scooter", "a recipe-planning app", "a smart water bottle", "a waterproof notebook",
            "a board game about trains", "a reusable coffee cup", "a pocket-sized telescope")

TASKS = (
    "Write a short story about {s}.",
    "Write a poem about {s}.",
    "Write a blog post about {s}.",
    "Write a short essay on {s}.",
    "Explain {s} to {a}.",
    "Write a letter to {r} about {s}.",
    "Write an email to {r} about {s}.",
    "Describe {s} in a few paragraphs.",
    "Write a speech about {s} for {a}.",
    "Write a diary entry about {s}.",
    "Write a news report about {s}.",
    "Give {a} some advice about {s}.",
    "Write a dialogue between two friends about {s}.",
    "Write a product description for {p}.",
    "Write a review of {p}.",
    "Write an advertisement for {p} aimed at {a}.",
    "Write a song about {s}.",
    "Write a limerick about {s}.",
    "Write a riddle about {s} and give its answer.",
    "Summarize what people should know about {s}.",
    "Write a travel guide entry about {s}.",
    "List some facts about {s}.",
    "Write a cover letter for a job at a company that works on {s}.",
    "Write a social media post about {s}.",
    "Write a short play scene about {s}.",
    "Write a fairy tale about {s}.",
    "Write a lesson plan about {s} for {a}.",
    "Write a complaint to {r} about {s}.",
    "Write a thank-you note to {r} about {s}.",
    "Compare two different opinions about {s}.",
    "Write a pitch for a documentary about {s}.",
    "Write a motivational message about {s} for {a}.",
)

QUESTIONS = (
    "Is {s} a good topic for a school project?",
    "Would {a} enjoy learning about {s}?",
    "Is {p} worth buying?",
    "Can {s} make people happier?",
    "Should every town care about {s}?",
    "Is it easy for {a} to get started with {s}?",
)


def request(rng: random.Random, *, question: bool = False) -> str:
    """One base request (a task, or a yes/no question when ``question``)."""
    template = rng.choice(QUESTIONS if question else TASKS)
    return template.format(s=rng.choice(SUBJECTS), a=rng.choice(AUDIENCES), r=rng.choice(RECIPIENTS),
                           p=rng.choice(PRODUCTS))


__all__ = ["AUDIENCES", "PRODUCTS", "QUESTIONS", "RECIPIENTS", "SUBJECTS", "TASKS", "request"]
