"""Names for the SQL world: themed noun domains, attribute words and pseudo-words.

Every name lies on exactly one *side*, ``"train"`` or ``"test"``, fixed once for all seeds:

* nouns come in themed domains; whole domains are train-side or test-side (``TEST_DOMAINS``);
* attribute words (``age``, ``weight``, ...) alternate between the sides;
* pseudo-words (``brovin``, ``kesta``) are made from syllables, and a hash of the word picks
  its side; a pseudo-word that happens to be a noun, an attribute or an SQL keyword is skipped.

So a test database, named only from test-side words, never shares a table or column name
(other than ``id``) with any training database.
"""

from __future__ import annotations

import hashlib
import random

DOMAINS: dict[str, str] = {
    "zoo": "lion tiger zebra giraffe monkey panda koala otter beaver badger rabbit turtle lizard "
    "parrot eagle falcon pigeon sparrow donkey camel llama bison moose walrus hamster ferret "
    "weasel raccoon squirrel gecko cobra viper toad frog ostrich penguin goose duck hippo rhino",
    "food": "bread butter cheese apple banana cherry grape lemon melon peach pear plum carrot "
    "potato onion garlic pepper tomato salad soup pasta pizza noodle rice bean cookie cake pie "
    "muffin bagel waffle honey sugar salt yogurt cereal sausage bacon steak",
    "school": "student teacher lesson course grade exam quiz homework pencil eraser ruler desk "
    "chalk school campus subject essay report tutor mentor pupil dean diploma degree semester "
    "lecture seminar thesis locker recess",
    "shop": "store shop customer invoice receipt cashier basket cart coupon discount vendor "
    "seller buyer brand item stock sale payment refund wallet budget ledger account bill cheque "
    "outlet retail",
    "music": "song album artist band guitar piano violin drum flute trumpet concert singer lyric "
    "melody chord tempo rhythm genre track playlist stage choir opera rapper banjo cello harp "
    "organ tuba ballad anthem",
    "sport": "team player coach game league season stadium goal referee tennis soccer hockey "
    "rugby golf boxing runner medal trophy racket helmet jersey sprint relay tackle inning "
    "pitcher batter umpire",
    "travel": "hotel flight airport ticket passport luggage suitcase tourist guide tour hostel "
    "cruise train bus taxi station journey voyage compass visa resort beach island museum castle",
    "garden": "flower tree rose tulip daisy lily orchid cactus fern moss seed leaf stem branch "
    "bush hedge lawn weed herb mint basil thyme garden shovel rake hose vine ivy",
    "office": "office manager clerk folder memo meeting printer stapler employee salary bonus "
    "project deadline intern boss agenda email phone laptop badge cubicle shift payroll",
    "city": "street avenue bridge tower park plaza mayor council citizen district suburb tunnel "
    "subway parking traffic building market bakery cafe diner theater hall mall",
    "farm": "farmer barn tractor field crop wheat corn barley oats hay cow horse pig sheep goat "
    "chicken rooster pony mule fence silo orchard plow harvest dairy milk egg wool",
    "home": "house kitchen sofa chair lamp bed pillow blanket carpet curtain mirror door roof "
    "stair closet shelf drawer oven fridge kettle spoon fork knife plate bowl cup mug",
    "tech": "computer server router cable screen mouse keyboard monitor robot sensor chip "
    "battery charger camera drone gadget widget pixel socket modem disk cloud signal device",
    "books": "book author novel poem poet chapter page editor reader comic story fable legend "
    "myth journal diary atlas magazine verse script",
    "clothes": "shirt jacket coat dress skirt hat scarf glove sock shoe boot sandal belt tie "
    "button zipper pocket collar sleeve vest hoodie apron uniform",
    "workshop": "hammer wrench drill saw nail screw bolt chisel pliers ladder bucket brush paint "
    "glue tape rope anvil lathe clamp vise bench",
    # ---- test-side domains
    "ocean": "whale shark dolphin squid octopus crab lobster shrimp oyster clam coral reef tide "
    "wave anchor sailor captain vessel buoy lagoon seaweed starfish jelly seal kelp pearl diver",
    "space": "planet comet meteor asteroid galaxy nebula orbit rocket moon sun saturn jupiter "
    "mars venus pluto cosmos crater alien probe capsule orbiter lunar solar quasar pulsar",
    "medicine": "doctor nurse patient hospital surgeon vaccine pill ward dentist therapy fever "
    "virus allergy bandage syringe injury symptom remedy pharmacy clinic medic tablet",
    "weather": "rain snow storm thunder breeze wind fog mist frost hail sleet drizzle blizzard "
    "tornado monsoon rainbow climate humidity forecast drought flood gust",
}
TEST_DOMAINS: tuple[str, ...] = ("ocean", "space", "medicine", "weather")
TRAIN_DOMAINS: tuple[str, ...] = tuple(d for d in DOMAINS if d not in TEST_DOMAINS)

# Attribute words: even positions are train-side, odd positions test-side.
INT_ATTRS = (
    "age weight height price rating year level points rank size width depth speed cost volume "
    "salary budget capacity score floor stock seats votes miles pages wins losses goals visits "
    "calories duration distance grams hours minutes lives laps tax fee"
).split()
TEXT_ATTRS = (
    "color city country status kind style brand shape flavor region mood habitat owner label "
    "motto nickname material pattern theme origin genre tone zone sector rarity category "
    "language texture diet alias"
).split()

SQL_KEYWORDS = frozenset(
    """abort action add after all alter always analyze and as asc attach autoincrement before
    begin between by cascade case cast check collate column commit conflict constraint create
    cross current current_date current_time current_timestamp database default deferrable
    deferred delete desc detach distinct do drop each else end escape except exclude exclusive
    exists explain fail filter first following for foreign from full generated glob group groups
    having if ignore immediate in index indexed initially inner insert instead intersect into is
    isnull join key last left like limit match materialized natural no not nothing notnull null
    nulls of offset on or order others outer over partition plan pragma preceding primary query
    raise range recursive references regexp reindex release rename replace restrict returning
    right rollback row rows savepoint select set table temp temporary then ties to transaction
    trigger unbounded union unique update using vacuum values view virtual when where window with
    without count max min avg sum total abs length lower upper round random date time rowid id
    true false""".split()
)

_ONSETS = "b c d f g h j k l m n p r s t v w z br bl cr dr fl fr gl gr pl pr sk sl sp st tr ch sh th".split()
_VOWELS = "a e i o u a e i o u ai ea oo ou".split()
_CODAS = ["", "", "", "", "n", "r", "l", "s", "m", "t", "k", "x"]

MIN_LEN, MAX_LEN = 3, 8


def _ok(word: str) -> bool:
    return (
        MIN_LEN <= len(word) <= MAX_LEN
        and word.isascii()
        and word.isalpha()
        and word.islower()
        and word not in SQL_KEYWORDS
    )


def _build_tables() -> tuple[dict[str, str], dict[str, str], dict[str, tuple[str, ...]], dict[str, tuple[str, ...]]]:
    side_of: dict[str, str] = {}
    domain_of: dict[str, str] = {}
    for domain, text in DOMAINS.items():
        side = "test" if domain in TEST_DOMAINS else "train"
        for w in text.split():
            if _ok(w) and w not in side_of:
                side_of[w], domain_of[w] = side, domain
    attrs: dict[str, list[str]] = {"int_train": [], "int_test": [], "text_train": [], "text_test": []}
    for kind, words in (("int", INT_ATTRS), ("text", TEXT_ATTRS)):
        for i, w in enumerate(words):
            if _ok(w) and w not in side_of:
                side = "train" if i % 2 == 0 else "test"
                side_of[w] = side
                attrs[f"{kind}_{side}"].append(w)
    nouns = {d: tuple(w for w, dd in domain_of.items() if dd == d) for d in DOMAINS}
    return side_of, domain_of, nouns, {k: tuple(v) for k, v in attrs.items()}


WORD_SIDE, WORD_DOMAIN, NOUNS, ATTRS = _build_tables()


def pseudo_side(word: str) -> str:
    """The fixed side of a pseudo-word: a quarter of the pseudo-word space is test-side."""
    h = int(hashlib.sha1(b"evolve-sql-world:" + word.encode()).hexdigest()[:8], 16)
    return "test" if h % 4 == 0 else "train"


def side_of(word: str) -> str:
    """``"train"`` or ``"test"`` for any name the world can produce."""
    return WORD_SIDE.get(word) or pseudo_side(word)


def pseudo_word(rng: random.Random, side: str, *, max_len: int = MAX_LEN) -> str:
    """A pronounceable made-up word (4..max_len letters) lying on ``side``."""
    while True:
        n = rng.choice((2, 2, 2, 3))
        word = "".join(rng.choice(_ONSETS) + rng.choice(_VOWELS) + rng.choice(_CODAS) for _ in range(n))
        if 4 <= len(word) <= max_len and _ok(word) and word not in WORD_SIDE and pseudo_side(word) == side:
            return word


def domains(side: str) -> tuple[str, ...]:
    """The noun domains of a side."""
    return TEST_DOMAINS if side == "test" else TRAIN_DOMAINS


def side_nouns(side: str) -> tuple[str, ...]:
    """All nouns of a side, across its domains (used for text values)."""
    return tuple(w for d in domains(side) for w in NOUNS[d])
