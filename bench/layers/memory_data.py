"""Synthetic but varied memory texts for the memory benchmarks: lessons, experiences and facts
about SQL / tool-use tasks with random entities (tables, columns, tools, errors, people, numbers).
Deterministic for a seed; texts are unique (a running counter is mixed into each)."""

from __future__ import annotations

import random

TABLES = [
    "orders",
    "customers",
    "invoices",
    "shipments",
    "employees",
    "products",
    "payments",
    "tickets",
    "sessions",
    "accounts",
    "flights",
    "bookings",
    "patients",
    "visits",
    "courses",
    "enrollments",
    "warehouses",
    "suppliers",
    "reviews",
    "campaigns",
    "devices",
    "readings",
    "contracts",
    "claims",
]
COLUMNS = [
    "id",
    "created_at",
    "status",
    "amount",
    "customer_id",
    "region",
    "price",
    "quantity",
    "email",
    "country",
    "due_date",
    "score",
    "category",
    "owner_id",
    "priority",
    "balance",
    "rating",
    "zip",
    "department",
    "salary",
    "latitude",
    "duration",
    "currency",
    "tier",
    "vendor_id",
    "sku",
]
TOOLS = [
    "sql_exec",
    "python",
    "web_search",
    "calculator",
    "file_reader",
    "grep",
    "http_get",
    "unit_converter",
    "date_parser",
    "csv_loader",
    "regex_tool",
    "json_path",
    "schema_inspect",
    "plotter",
]
ERRORS = [
    "a syntax error",
    "a timeout",
    "an empty result",
    "a type mismatch",
    "a division by zero",
    "a missing column error",
    "an ambiguous column error",
    "a wrong join",
    "duplicated rows",
    "an off-by-one date range",
    "a null comparison bug",
    "a rate limit",
    "an encoding error",
]
PEOPLE = [
    "Alice",
    "Bashir",
    "Chen",
    "Dolores",
    "Emeka",
    "Fatima",
    "Goran",
    "Hiroko",
    "Ines",
    "Jonas",
    "Kavya",
    "Luis",
    "Mei",
    "Nadia",
    "Oskar",
    "Priya",
    "Quentin",
    "Rosa",
    "Sven",
    "Tariq",
    "Uma",
    "Viktor",
]
CITIES = [
    "Lagos",
    "Oslo",
    "Lima",
    "Pune",
    "Osaka",
    "Quito",
    "Porto",
    "Hanoi",
    "Tunis",
    "Graz",
    "Cusco",
    "Leeds",
    "Davao",
    "Bergen",
    "Sapporo",
    "Arusha",
    "Bilbao",
    "Tartu",
]
VERBS = ["filter", "group", "aggregate", "sort", "deduplicate", "join", "window", "pivot", "count", "rank"]
ADVICE = [
    "check the schema before writing the query",
    "quote identifiers that clash with keywords",
    "cast the column to a number first",
    "use LEFT JOIN to keep unmatched rows",
    "compare dates as ISO strings",
    "add DISTINCT only after checking the join keys",
    "limit the result before sorting large tables",
    "handle NULL with COALESCE",
    "retry with a smaller page size",
    "read the tool's error message before retrying",
    "prefer an exact match over LIKE",
    "verify the unit of the amount column",
]

LESSON = [
    "When a task asks to {verb} {table} by {col}, {advice}; otherwise it fails with {err} (case {n}).",
    "Lesson {n}: {advice} whenever {table}.{col} is involved, after {err} in task {n}.",
    "If {tool} returns {err} on {table} (run {n}), {advice} and call it again once.",
    "Never {verb} {table} on {col} without checking {col2}; {err} follows ({n}).",
]
EXPERIENCE = [
    "Task {n}: {person} asked for the {col} of {table} in {city}; used {tool}, hit {err}, fixed it and succeeded.",
    "Trajectory {n}: {verb} {table} by {col2}, then {tool}; reward 1 after {k} steps.",
    "In episode {n} the agent joined {table} with {table2} on {col} and got {err}; it then chose to {advice}.",
    "Succeeded on task {n} ({city}): {tool} read {table2}.{col2}, the answer was {num}.",
]
FACT = [
    "{table}.{col} stores values in {unit}; {n} rows were checked by {person}.",
    "The {table} table of the {city} database has {num} rows and a {col2} column (audit {n}).",
    "{person} owns the {table2} dataset; its {col} column is nullable (note {n}).",
    "Tool {tool} accepts at most {k} calls per minute for project {n}.",
]
UNITS = ["cents", "euros", "seconds", "kilograms", "percent", "UTC timestamps", "kilometres", "ISO dates"]


def make_texts(n: int, seed: int = 0) -> list[tuple[str, str]]:
    """``n`` unique (kind, text) pairs: about 40% lessons, 40% experiences, 20% facts."""
    rng = random.Random(seed)
    out: list[tuple[str, str]] = []
    for i in range(n):
        r = rng.random()
        kind, templates = ("lesson", LESSON) if r < 0.4 else ("experience", EXPERIENCE) if r < 0.8 else ("fact", FACT)
        t1, t2 = rng.sample(TABLES, 2)
        c1, c2 = rng.sample(COLUMNS, 2)
        text = rng.choice(templates).format(
            verb=rng.choice(VERBS),
            table=t1,
            table2=t2,
            col=c1,
            col2=c2,
            advice=rng.choice(ADVICE),
            err=rng.choice(ERRORS),
            tool=rng.choice(TOOLS),
            person=rng.choice(PEOPLE),
            city=rng.choice(CITIES),
            unit=rng.choice(UNITS),
            n=f"{seed}-{i}",
            k=rng.randint(2, 40),
            num=rng.randint(10, 99999),
        )
        out.append((kind, text))
    return out


def make_queries(n: int, seed: int = 1) -> list[str]:
    """Short natural queries over the same vocabulary (not copies of stored texts)."""
    rng = random.Random(seed)
    forms = [
        "how to {verb} {table} by {col}",
        "what went wrong with {tool} on {table}",
        "{err} when joining {table} and {table2}",
        "who owns the {table} data in {city}",
        "unit of {table}.{col}",
        "lessons about {col} in {table}",
    ]
    return [
        rng.choice(forms).format(
            verb=rng.choice(VERBS),
            table=rng.choice(TABLES),
            table2=rng.choice(TABLES),
            col=rng.choice(COLUMNS),
            tool=rng.choice(TOOLS),
            err=rng.choice(ERRORS),
            city=rng.choice(CITIES),
        )
        for _ in range(n)
    ]
