"""Builds the labelled evaluation set for conversation search: bench/eval/dataset.json.

Deterministic: templates filled from one seeded `random.Random`; no network, no model. Run

    .venv/bin/python bench/eval/make_dataset.py            # writes bench/eval/dataset.json
    .venv/bin/python bench/eval/make_dataset.py --check    # regenerates and fails if it differs
    .venv/bin/python bench/eval/make_dataset.py --samples 20   # also prints random questions

Every question is checked against its category's rule before it is kept (see README.md):
`paraphrase` shares no content word with its relevant turns (a conservative stem/prefix
match, stricter than the service's stemmer), `keyword` shares a rare one and no id,
`exact_id` carries an id verbatim and its relevant set is every turn of that principal that
contains the id, `mixed` shares some words and not others. A question that breaks its rule
is dropped (and counted), never relabelled.
"""

# ruff: noqa: E501, RUF001  (prose: long sentences and real dashes are the data)
from __future__ import annotations

import argparse
import json
import random
import re
import sys
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

SEED = 20250601
OUT = Path(__file__).resolve().parent / "dataset.json"
SCHEMA_VERSION = 1
FACTS_PER_PRINCIPAL = 21
FILLERS_PER_PRINCIPAL = 30

# --------------------------------------------------------------------------------------------
# Personas: two tenants, three principals each. The principal id `u-alice` exists in both
# tenants (a different person), and some ids are shared on purpose (see SHARED_IDS), so a
# search that leaks across tenants or principals shows up as a wrong hit.
# --------------------------------------------------------------------------------------------

PERSONAS: list[dict[str, str]] = [
    {
        "tenant": "acme",
        "principal": "u-alice",
        "name": "Alice Brennan",
        "city": "Denver",
        "partner": "Jonas",
        "partner_rel": "husband",
        "kid": "Maya",
        "kid2": "Theo",
        "pet": "Biscuit",
        "breed": "beagle",
        "employer": "Acme Robotics",
        "manager": "Priya",
        "colleague": "Marcus",
        "cur": "$",
        "parent": "mom",
        "landlord": "Mr. Halvorsen",
        "doctor": "Okafor",
        "role": "backend engineer",
    },
    {
        "tenant": "acme",
        "principal": "u-bruno",
        "name": "Bruno Esposito",
        "city": "Leeds",
        "partner": "Harriet",
        "partner_rel": "wife",
        "kid": "Luca",
        "kid2": "Sofia",
        "pet": "Pickle",
        "breed": "border collie",
        "employer": "Acme Robotics",
        "manager": "Gwen",
        "colleague": "Tomasz",
        "cur": "£",
        "parent": "dad",
        "landlord": "Mrs. Ackroyd",
        "doctor": "Lindqvist",
        "role": "product manager",
    },
    {
        "tenant": "acme",
        "principal": "u-chen",
        "name": "Chen Wei",
        "city": "Toronto",
        "partner": "Rafael",
        "partner_rel": "partner",
        "kid": "Aiko",
        "kid2": "Jun",
        "pet": "Mochi",
        "breed": "shiba inu",
        "employer": "Acme Robotics",
        "manager": "Dev",
        "colleague": "Ingrid",
        "cur": "$",
        "parent": "mother",
        "landlord": "Mr. Dubois",
        "doctor": "Abernathy",
        "role": "data analyst",
    },
    {
        "tenant": "globex",
        "principal": "u-alice",
        "name": "Alice Moreau",
        "city": "Lyon",
        "partner": "Étienne",
        "partner_rel": "husband",
        "kid": "Zoë",
        "kid2": "Hugo",
        "pet": "Figaro",
        "breed": "tabby cat",
        "employer": "Globex Logistics",
        "manager": "Nadia",
        "colleague": "Karim",
        "cur": "€",
        "parent": "father",
        "landlord": "M. Girard",
        "doctor": "Fontaine",
        "role": "operations lead",
    },
    {
        "tenant": "globex",
        "principal": "u-dana",
        "name": "Dana Kowalski",
        "city": "Austin",
        "partner": "Sam",
        "partner_rel": "wife",
        "kid": "Ezra",
        "kid2": "Lily",
        "pet": "Waffles",
        "breed": "golden retriever",
        "employer": "Globex Logistics",
        "manager": "Hector",
        "colleague": "Yuki",
        "cur": "$",
        "parent": "dad",
        "landlord": "Ms. Pruitt",
        "doctor": "Ramanathan",
        "role": "site reliability engineer",
    },
    {
        "tenant": "globex",
        "principal": "u-emeka",
        "name": "Emeka Obi",
        "city": "Melbourne",
        "partner": "Chloe",
        "partner_rel": "fiancée",
        "kid": "Ada",
        "kid2": "Kofi",
        "pet": "Pepper",
        "breed": "greyhound",
        "employer": "Globex Logistics",
        "manager": "Siobhan",
        "colleague": "Arjun",
        "cur": "$",
        "parent": "mum",
        "landlord": "Mr. Papadakis",
        "doctor": "Whitcombe",
        "role": "finance analyst",
    },
]

# Ids deliberately shared: the same value in several principals' turns.
SHARED_IDS: dict[str, dict[str, str]] = {
    # Same bank account number for both u-alice principals (different tenants).
    "acct": {"acme/u-alice": "acct-4821", "globex/u-alice": "acct-4821"},
    # Same company-wide IT incident for two colleagues in each tenant.
    "inc": {
        "acme/u-alice": "INC-20931",
        "acme/u-bruno": "INC-20931",
        "globex/u-dana": "INC-31877",
        "globex/u-emeka": "INC-31877",
    },
}

# --------------------------------------------------------------------------------------------
# Value pools
# --------------------------------------------------------------------------------------------

BANKS = [
    "Northwind Credit Union",
    "Harbor Savings Bank",
    "First Cascade Bank",
    "Bluebell Mutual",
    "Lakeshore Federal",
    "Granite Trust",
    "Kestrel Bank",
]
CLIENTS = [
    "Pinecrest Dental",
    "Orbital Coffee Co.",
    "Vantage Realty",
    "Lumen Yoga Studio",
    "Brightwater Brewing",
    "Copperleaf Architects",
    "Nimbus Florists",
    "Tidewell Marine",
]
MERCHANTS = [
    "Zephyr Electronics",
    "Hollis Home Goods",
    "Quickcart",
    "Saffron & Sage",
    "Urban Outfield",
    "MegaMart",
    "Peak Outdoor Supply",
]
ACCOUNTANTS = [
    "Rosalind Mercer",
    "Farid Haddad",
    "Greta Lindholm",
    "Oscar Pemberton",
    "Beatriz Salgado",
    "Wen Tao",
]
GOALS = ["kitchen renovation", "emergency", "new car", "wedding", "sabbatical", "house deposit"]
VENDORS = ["Delphi Office Supply", "Northstar IT", "Brightline Hardware", "Corvid Systems"]
PO_ITEMS = [
    ("27-inch monitors", "docking stations"),
    ("ergonomic chairs", "standing desks"),
    ("laptops", "laptop bags"),
    ("headsets", "webcams"),
]
CODENAMES = ["Falcon", "Bluejay", "Orca", "Kingfisher", "Tamarack", "Juniper", "Meridian"]
SYSTEMS = [
    ("the billing service", "Kubernetes"),
    ("our data warehouse", "Snowflake"),
    ("the customer portal", "a new React frontend"),
    ("the order pipeline", "event sourcing on Kafka"),
    ("the identity service", "a managed Keycloak"),
]
SERVICES = [
    "ledger-sync",
    "invoice-worker",
    "route-planner",
    "notify-gateway",
    "stock-importer",
    "report-builder",
]
TABLES = ["shipments", "invoices", "ledger_entries", "customer_events", "stock_levels"]
BRANCHES = ["feature/export-csv", "fix/retry-backoff", "feature/sso-login", "hotfix/rounding"]
ENDPOINTS = ["checkout", "profile", "orders/sync", "devices/register", "cart/merge"]
PAYLOAD_KEYS = ["tenant", "device_id", "locale", "shipping_address", "promo_code"]
ALLERGENS = [  # (noun, adjective form, dish)
    ("peanuts", "peanut", "satay noodles"),
    ("shellfish", "shellfish", "paella"),
    ("sesame", "sesame", "stir-fry"),
    ("tree nuts", "tree nut", "pesto pasta"),
    ("eggs", "egg", "carbonara"),
]
MEDS = [
    ("levothyroxine", "50", "an underactive thyroid"),
    ("lisinopril", "10", "blood pressure"),
    ("sertraline", "50", "anxiety"),
    ("metformin", "500", "prediabetes"),
    ("atorvastatin", "20", "cholesterol"),
]
RACES = ["Riverbend", "Harbourfront", "Cherry Blossom", "Foothills", "Lakeside Classic"]
PHYSIOS = ["Annika", "Desmond", "Lorena", "Kaito", "Bridget"]
BODY = [
    ("left knee", "patellar tendinopathy", "jumper's knee"),
    ("right shoulder", "rotator cuff tendinitis", "an irritated rotator cuff"),
    ("lower back", "a lumbar strain", "a pulled lower back muscle"),
    ("right ankle", "peroneal tendinitis", "a grumpy ankle tendon"),
]
DENTISTS = ["Ferreira", "Novak", "Achebe", "Sandoval", "Kimura"]
TRIPS = [
    ("Lisbon", "Portugal", "TAP Air Portugal", "TP", "Berlenga"),
    ("Kyoto", "Japan", "Japan Airlines", "JL", "Naoshima"),
    ("Reykjavik", "Iceland", "Icelandair", "FI", "Heimaey"),
    ("Hanoi", "Vietnam", "Vietnam Airlines", "VN", "Cat Ba"),
    ("Edinburgh", "Scotland", "British Airways", "BA", "Arran"),
    ("Tbilisi", "Georgia", "Georgian Airways", "A9", "Ananuri"),
    ("Oaxaca", "Mexico", "Aeroméxico", "AM", "Puerto Escondido"),
    ("Tallinn", "Estonia", "Finnair", "AY", "Saaremaa"),
]
HOTELS = [
    "Casa do Rio",
    "Hotel Amaryllis",
    "The Quill & Lantern",
    "Residence Solace",
    "Hotel Vireo",
    "Maison Ambre",
]
RESTAURANTS = [
    "Taberna Larga",
    "Kissa Hoshi",
    "Sjávargrillið",
    "Bếp Mẹ Ỉn",
    "The Gilded Thistle",
    "Salobie",
    "Casa Oaxaca Terraza",
    "Rataskaevu 16",
]
STARTERS = ["Clint Yeastwood", "Doughbi-Wan", "Bread Pitt", "Gluten Morgen", "Sir Rise-a-Lot"]
SHOE_BRANDS = ["Stridewell", "Asterion", "Kinetix", "Hollowpeak"]
APPLIANCE_BRANDS = ["Lindqvist", "Bosch", "Whirlpool", "Haier", "Beko"]
ROLES = [
    "the Cheshire Cat",
    "a singing teapot",
    "the Tin Man",
    "Captain Hook",
    "the narrator",
    "a dancing carrot",
    "the Queen of Hearts",
]
HOSPITALS = [
    "St. Brigid's Hospital",
    "Mercy General",
    "Riverside Medical Center",
    "Hôpital Saint-Luc",
    "Royal Park Hospital",
]
SURGERIES = [
    ("hip replacement", "hip"),
    ("cataract", "eye"),
    ("knee arthroscopy", "knee"),
    ("gallbladder removal", "gallbladder"),
]
VET_CLINICS = [
    "Paws & Claws Veterinary",
    "Northside Animal Clinic",
    "Clinique Vétérinaire du Parc",
    "Cedar Vet Hospital",
]
ROUTERS = ["Netgear RAX40", "TP-Link Archer AX55", "ASUS RT-AX58U", "Eero 6+"]
IT_PEOPLE = [
    "Kevin from IT",
    "Shreya on the service desk",
    "Olu from desktop support",
    "Marta in IT",
]
VPN_CLIENTS = ["GlobalProtect", "Cisco AnyConnect", "WireGuard", "FortiClient"]
LEGACY = ["Looker sales", "old Tableau ops", "Grafana capacity", "Excel finance"]
DOMAINS = ["acme-internal.net", "globex.local", "corp.example.org"]
SURNAMES = ["Brennan", "Esposito", "Wei", "Moreau", "Kowalski", "Obi"]

# --------------------------------------------------------------------------------------------
# Text rules used by the checks (kept conservative: stricter than any real stemmer)
# --------------------------------------------------------------------------------------------

STOP = set(
    """
a about above after again against all am an and any are aren as at be because been before
being below between both but by can cannot could couldn did didn do does doesn doing don down
during each few for from further had hadn has hasn have haven having he her here hers herself
him himself his how i if in into is isn it its itself just let ll m me might more most must
mustn my myself no nor not now o of off on once only or other ought our ours ourselves out over
own re s same shan she should shouldn so some such t than that the their theirs them
themselves then there these they this those through to too under until up ve very was wasn we
were weren what when where which while who whom why will with won would wouldn y you your
yours yourself yourselves d get got also yet still ever
""".split()  # noqa: SIM905 (a word list reads better as text)
)

SUFFIXES = ("ations", "ation", "ings", "ing", "ies", "ied", "ers", "er", "ed", "es", "s", "ly", "e")


def words(text: str) -> list[str]:
    return re.findall(r"[a-z0-9]+", text.lower())


def content(text: str) -> set[str]:
    return {w for w in words(text) if w not in STOP and len(w) > 1}


def norm(w: str) -> str:
    if w.isdigit():
        return w
    for suf in SUFFIXES:
        if w.endswith(suf) and len(w) - len(suf) >= 3:
            return w[: -len(suf)]
    return w


def related(a: str, b: str) -> bool:
    """True when two content words could be the same word to any stemmer (conservative)."""
    if a.isdigit() or b.isdigit():
        return a == b
    if norm(a) == norm(b):
        return True
    short = min(len(a), len(b))
    if short < 3:
        return False
    common = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        common += 1
    return common >= min(5, short)


def shared_words(query: str, text: str) -> set[str]:
    tw = content(text)
    return {q for q in content(query) if any(related(q, t) for t in tw)}


# --------------------------------------------------------------------------------------------
# Small helpers
# --------------------------------------------------------------------------------------------


def fmt_date(rng: random.Random, d: datetime) -> str:
    style = rng.randrange(4)
    if style == 0:
        return d.strftime("%B %-d")
    if style == 1:
        return d.strftime("%-d %B")
    if style == 2:
        return d.strftime("%Y-%m-%d")
    return d.strftime("%a %b %-d")


def money(cur: str, n: float, cents: bool = False) -> str:
    if cents:
        return f"{cur}{n:,.2f}"
    return f"{cur}{round(n):,}"


def digits(rng: random.Random, n: int) -> str:
    return "".join(rng.choice("0123456789") for _ in range(n)).replace("0", "7", 1)


def upper_alnum(rng: random.Random, n: int) -> str:
    while True:
        s = "".join(rng.choice("ABCDEFGHJKLMNPQRSTUVWXYZ23456789") for _ in range(n))
        if any(ch.isdigit() for ch in s) and any(ch.isalpha() for ch in s):
            return s


def near_digits(rng: random.Random, s: str) -> str:
    """Same length, one digit changed or two neighbours swapped: acct-4821 -> acct-4822."""
    chars = list(s)
    pos = [i for i, ch in enumerate(chars) if ch.isdigit()]
    while True:
        out = chars[:]
        if rng.random() < 0.5 and len(pos) >= 2:
            i = rng.choice(pos[:-1])
            j = i + 1 if (i + 1) in pos else i
            out[i], out[j] = out[j], out[i]
        else:
            i = rng.choice(pos)
            out[i] = str((int(out[i]) + rng.choice([1, 2, 8, 9])) % 10)
        if out != chars:
            return "".join(out)


@dataclass
class Ctx:
    rng: random.Random
    p: dict[str, str]
    now: datetime
    state: dict[str, object]

    def pick(self, seq):  # type: ignore[no-untyped-def]
        return self.rng.choice(seq)

    def date(self, lo: int, hi: int) -> str:
        return fmt_date(self.rng, self.now + timedelta(days=self.rng.randint(lo, hi)))

    def money(self, lo: int, hi: int, step: int = 5, cents: bool = False) -> str:
        n = self.rng.randrange(lo, hi, step)
        if cents:
            return money(self.p["cur"], n + self.rng.randrange(100) / 100, True)
        return money(self.p["cur"], n)

    def key(self) -> str:
        return f"{self.p['tenant']}/{self.p['principal']}"


@dataclass
class Fact:
    turns: list[tuple[str, str]]
    target: list[int]
    queries: dict[str, list[str]]
    ids: list[str] = field(default_factory=list)
    long: bool = False
    deep: str = ""  # long turns: the fact's text, which must start past character 4,000


@dataclass(frozen=True)
class Template:
    name: str
    topic: str
    make: Callable[[Ctx], Fact]
    long: bool = False
    needs: str | None = None  # another template that must be chosen with this one


TEMPLATES: dict[str, Template] = {}


def template(name: str, topic: str, long: bool = False, needs: str | None = None):  # type: ignore[no-untyped-def]
    def deco(fn: Callable[[Ctx], Fact]) -> Callable[[Ctx], Fact]:
        TEMPLATES[name] = Template(name, topic, fn, long, needs)
        return fn

    return deco


def para(*sentences: str) -> str:
    return " ".join(s.strip() for s in sentences if s.strip())


# Topic sentences sprinkled into answers, so turns of one topic share ordinary vocabulary.
EXTRA: dict[str, list[str]] = {
    "finance": [
        "Keep screenshots of every confirmation page; they settle most arguments quickly.",
        "It is worth reviewing statements once a month rather than once a year.",
        "If anything looks unfamiliar, call the number printed on the back of your card, not one from an email.",
        "A simple spreadsheet with one row per month is usually enough to spot a trend.",
        "Automating transfers on payday removes most of the willpower from saving.",
    ],
    "work": [
        "Write the decision and its owner in the ticket so nobody has to reconstruct it later.",
        "A short written update before the meeting usually makes the meeting itself shorter.",
        "If the scope changes, say so early and in writing; surprises are what erode trust.",
        "Ask for the acceptance criteria up front so 'done' means the same thing to everyone.",
        "It helps to keep a running doc of open questions and who is answering each one.",
    ],
    "software": [
        "Add a regression test that reproduces the failure before changing anything.",
        "Log the request id with every error line so you can follow one call across services.",
        "Roll the change out behind a flag first, then remove the flag once it has baked for a week.",
        "Check the library's changelog for the version you upgraded from; the answer is often there.",
        "Reproduce it locally with the same environment variables as production if you can.",
    ],
    "health": [
        "Write down how you feel each day for two weeks; patterns are easier to see on paper.",
        "Bring a list of questions to the appointment, because they are easy to forget in the room.",
        "Consistency matters more than intensity for almost every routine like this.",
        "If anything gets worse rather than better, call the clinic instead of waiting it out.",
        "Hydration and sleep affect this more than most people expect.",
    ],
    "travel": [
        "Save offline maps of the area before you leave, in case mobile data is patchy.",
        "Photograph your documents and keep the copies somewhere separate from the originals.",
        "Local public transport is usually faster than taxis in the old town.",
        "Notify your card issuer about the dates so purchases abroad are not blocked.",
        "Pack one change of clothes in your carry-on in case checked luggage is delayed.",
    ],
    "cooking": [
        "Taste as you go and adjust the salt at the end rather than the start.",
        "Mise en place — everything chopped before the pan is hot — makes weeknight cooking calmer.",
        "Leftovers keep for three days in the fridge in a sealed container.",
        "A cheap oven thermometer is one of the best kitchen purchases you can make.",
        "Doubling the recipe works, but give the pan a few extra minutes.",
    ],
    "shopping": [
        "Keep the original packaging until you are sure you are keeping the item.",
        "Most retailers extend return windows around the holidays, so check the policy.",
        "Paying by credit card gives you extra protection if the seller does not cooperate.",
        "Reviews that mention long-term use are worth more than first-impression ones.",
    ],
    "family": [
        "Put it on the shared family calendar so nobody double-books that day.",
        "Kids usually cope better with changes when they know the plan a few days ahead.",
        "Asking for help from friends and neighbours is completely reasonable here.",
        "A small ritual around it can make the day feel special without much extra work.",
    ],
}


def extra(c: Ctx, topic: str, n: int | None = None) -> str:
    k = c.rng.randint(0, 2) if n is None else n
    return " ".join(c.rng.sample(EXTRA[topic], k))


# ----------------------------------------------------------------------------- finance


@template("rent_debit", "finance")
def t_rent_debit(c: Ctx) -> Fact:
    acct = SHARED_IDS["acct"].get(c.key()) or f"acct-{digits(c.rng, 4)}"
    c.state["acct"] = acct
    bank = c.pick(BANKS)
    c.state["bank"] = bank
    amount = c.money(900, 2400, 25)
    ll = c.p["landlord"]
    q = c.pick(
        [
            f"My rent direct debit from {acct} at {bank} bounced again this month. {ll} says the "
            f"{amount} never arrived. What should I do?",
            f"The rent collection out of {acct} ({bank}) failed on the 1st and {ll} just emailed "
            f"that {amount} is missing. Next steps?",
        ]
    )
    a = para(
        "That's stressful, but it's usually fixable the same day.",
        f"First, log in to {bank} and check that the mandate on {acct} is still listed as active "
        "— mandates sometimes get cancelled when a card is reissued.",
        f"If the balance was fine on the collection date, call {bank} and ask for the return "
        "reason code: 'refer to payer' usually means insufficient funds at that moment, while "
        "'no instruction' means the mandate itself is gone.",
        f"Send {ll} a short note saying you're aware and will transfer {amount} manually today, "
        "and keep the confirmation.",
        "Once it's sorted, set a reminder two days before the next collection to check the "
        "balance.",
        extra(c, "finance"),
    )
    return Fact(
        turns=[(q, a)],
        target=[0],
        ids=[acct],
        queries={
            "exact_id": [
                f"what did we say about {acct}?",
                f"{acct}",
                f"why did the payment from {acct} fail",
                f"remind me what went wrong with {acct}",
            ],
            "keyword": [
                f"{bank} mandate return reason code",
                "rent mandate cancelled reissued",
                f"{ll} rent collection failed",
            ],
            "paraphrase": [
                "why didn't the cash for my apartment reach the owner of my flat?",
                "housing bill that got rejected — advice?",
                "what went wrong with covering the cost of where I live?",
            ],
            "mixed": [
                f"did {ll} get paid this month?",
                f"{bank} trouble with my monthly housing transfer",
            ],
        },
    )


@template("savings_rate", "finance", needs="rent_debit")
def t_savings_rate(c: Ctx) -> Fact:
    base = str(c.state.get("acct") or f"acct-{digits(c.rng, 4)}")
    acct2 = near_digits(c.rng, base)
    bank = str(c.state.get("bank") or c.pick(BANKS))
    rate = c.pick(["4.35", "4.1", "3.85", "4.6", "3.95"])
    deposit = c.rng.randrange(5000, 30000, 500)
    grown = deposit * (1 + float(rate) / 100)
    goal = c.pick(GOALS)
    c.state["goal"] = goal
    cur = c.p["cur"]
    q = (
        f"I opened a high-yield savings account, {acct2}, at {bank} last week for the {goal} "
        f"fund. They quoted {rate}% APY. Is that good right now, and what would "
        f"{money(cur, deposit)} grow to in a year?"
    )
    a = para(
        f"{rate}% APY is competitive for an instant-access account at the moment.",
        f"On {money(cur, deposit)}, a year at {rate}% compounding monthly comes to roughly "
        f"{money(cur, grown)}, before tax on the interest.",
        "Check whether the quoted figure is an introductory bonus that drops after a few months, "
        "and whether withdrawals are limited per statement cycle.",
        f"Keeping the {goal} fund in its own account, as you've done, makes it much less "
        "tempting to dip into.",
        extra(c, "finance"),
    )
    return Fact(
        turns=[(q, a)],
        target=[0],
        ids=[acct2],
        queries={
            "exact_id": [
                f"{acct2} interest",
                f"what did we discuss about {acct2}",
                f"how much does {acct2} earn",
            ],
            "keyword": [f"high-yield APY {goal} fund", f"{rate}% APY introductory bonus"],
            "paraphrase": [
                "what will my nest egg earn annually?",
                "what return was I promised on the stash I'm putting aside?",
            ],
            "mixed": [f"{goal} pot — how fast will it grow?"],
        },
    )


@template("invoice_chase", "finance")
def t_invoice_chase(c: Ctx) -> Fact:
    year = c.now.year
    inv = f"INV-{year}-{digits(c.rng, 4)}"
    c.state["inv"] = inv
    client = c.pick(CLIENTS)
    c.state["client"] = client
    amount = c.money(800, 6000, 50)
    due = c.date(-30, -8)
    work = c.pick(
        [
            "website redesign",
            "brand photography",
            "bookkeeping cleanup",
            "menu illustrations",
            "data migration",
        ]
    )
    q = c.pick(
        [
            f"{client} still hasn't paid invoice {inv} for the {work} — {amount}, due {due}. "
            "How do I chase them politely?",
            f"Can you help me write a reminder? Invoice {inv} to {client} ({work}, {amount}) was "
            f"due {due} and nothing yet.",
        ]
    )
    a = para(
        "Here's a friendly but firm reminder you can send:",
        f"\n\nSubject: Reminder — invoice {inv} ({amount})\n\nHi, I hope things are going well. "
        f"A quick note that invoice {inv} for the {work} was due on {due} and I haven't seen the "
        "transfer come through yet. Could you let me know when it's scheduled? I've attached a "
        "copy for convenience. Thanks!\n\n",
        "If there's no reply within a week, a phone call to their accounts-payable contact works "
        "better than a second email. Your terms can also include a late fee for next time.",
        extra(c, "finance", 1),
    )
    return Fact(
        turns=[(q, a)],
        target=[0],
        ids=[inv],
        queries={
            "exact_id": [f"{inv}", f"did {client} ever pay {inv}?", f"status of {inv}"],
            "keyword": [f"{client} invoice reminder", f"reminder email {work} invoice"],
            "paraphrase": [
                "which customer owes me for freelance jobs past the deadline?",
                "who hasn't cleared their bill with me?",
            ],
            "mixed": [f"how much does {client} owe me?"],
        },
    )


@template("invoice_paid", "finance", needs="invoice_chase")
def t_invoice_paid(c: Ctx) -> Fact:
    base = str(c.state.get("inv") or f"INV-{c.now.year}-{digits(c.rng, 4)}")
    inv2 = near_digits(c.rng, base)
    client = c.pick([x for x in CLIENTS if x != c.state.get("client")])
    amount = c.money(300, 3000, 25)
    q = (
        f"Good news: {client} paid invoice {inv2} ({amount}) in four days. How should I record "
        "that for taxes, and should I set some aside?"
    )
    a = para(
        f"Nice — record {inv2} as income on the date the money landed, not the date you invoiced, "
        "if you're on cash-basis accounting, which most sole traders are.",
        f"A common rule of thumb is to move 25–30% of {amount} into a separate tax pot straight "
        "away so the quarterly estimate never comes as a shock.",
        "Keep the remittance advice with the invoice in the same folder.",
        extra(c, "finance"),
    )
    return Fact(
        turns=[(q, a)],
        target=[0],
        ids=[inv2],
        queries={
            "exact_id": [f"{inv2}", f"was {inv2} paid?"],
            "keyword": ["cash-basis remittance tax pot", f"{client} paid invoice"],
            "paraphrase": ["which customer cleared their bill fast, and how do I log it?"],
        },
    )


@template("card_dispute", "finance")
def t_card_dispute(c: Ctx) -> Fact:
    dsp = f"DSP-{digits(c.rng, 6)}"
    merchant = c.pick(MERCHANTS)
    amount = c.money(40, 700, 1, cents=True)
    card = c.pick(["Visa", "Mastercard", "Amex"])
    q = c.pick(
        [
            f"There's a double charge of {amount} from {merchant} on my {card}. I opened dispute "
            f"{dsp} with the issuer this morning. What happens now?",
            f"{merchant} charged my {card} twice ({amount} each). The issuer gave me case {dsp}. "
            "How long do these take?",
        ]
    )
    a = para(
        "Duplicate charges are the easiest kind of chargeback to win.",
        f"The issuer will usually post a provisional credit for {amount} within about ten "
        f"business days while they ask {merchant} for evidence.",
        "Keep the receipt or order confirmation showing a single purchase, and note the case "
        "number on it.",
        "If the merchant refunds you directly in the meantime, tell the issuer so the case is "
        "closed and you're not credited twice.",
        extra(c, "finance"),
    )
    return Fact(
        turns=[(q, a)],
        target=[0],
        ids=[dsp],
        queries={
            "exact_id": [f"{dsp}", f"where are we with {dsp}?", f"case {dsp} chargeback"],
            "keyword": [f"{merchant} chargeback provisional credit", f"{merchant} double charge"],
            "paraphrase": [
                "a shop billed me two times for the same thing — what did I do?",
                "a store took my money two times; how did I contest it?",
            ],
            "mixed": [f"did {merchant} bill me by mistake?"],
        },
    )


@template("tax_estimate", "finance")
def t_tax_estimate(c: Ctx) -> Fact:
    acc = c.pick(ACCOUNTANTS)
    qn = (c.now.month - 1) // 3 + 1
    amount = c.money(1200, 7800, 10)
    due = c.date(10, 40)
    q = (
        f"My accountant {acc} says my Q{qn} estimated tax payment is {amount}, due {due}. Can you "
        "remind me how to pay it online and what happens if I'm a few days late?"
    )
    a = para(
        "You can pay through the tax authority's official online portal with a bank transfer; "
        "you'll get a confirmation number, which is worth saving as a PDF.",
        f"Being a few days late on {amount} usually means a small underpayment penalty "
        "calculated like interest, not a flat fine, so paying as soon as you can limits it.",
        f"It's also worth asking {acc} whether the safe-harbour rule applies to you this year.",
        extra(c, "finance"),
    )
    return Fact(
        turns=[(q, a)],
        target=[0],
        queries={
            "keyword": [f"Q{qn} estimated tax {acc}", "underpayment penalty safe-harbour"],
            "paraphrase": [
                "how much do I owe the government this quarter, and by when?",
                "what's my next installment to the revenue agency?",
            ],
            "mixed": [f"what figure did {acc} give me?"],
        },
    )


@template("grocery_budget", "finance")
def t_grocery_budget(c: Ctx) -> Fact:
    amt = c.money(450, 1100, 25)
    save = c.money(150, 900, 50)
    goal = str(c.state.get("goal") or c.pick(GOALS))
    q = (
        f"New rule for our household: groceries capped at {amt} a month, and {save} goes into "
        f"the {goal} fund on payday. Can you help me make a simple tracking sheet?"
    )
    a = para(
        "Sure. Make one tab with columns for date, store, total and a running monthly sum; "
        f"add a cell that turns red when the sum passes {amt}.",
        f"On a second tab, list each payday transfer of {save} and the fund balance after it, "
        "so you can see the progress line climbing.",
        "Review both tabs together on the last Sunday of the month.",
        extra(c, "finance"),
    )
    return Fact(
        turns=[(q, a)],
        target=[0],
        queries={
            "keyword": ["groceries capped tracking sheet", f"payday {goal} fund tracking"],
            "paraphrase": [
                "what's my spending ceiling at the supermarket?",
                "how much can we blow on food shopping in four weeks?",
            ],
            "mixed": [f"how much am I stashing for the {goal} each pay cycle?"],
        },
    )


# ----------------------------------------------------------------------------- work


@template("it_ticket", "work")
def t_it_ticket(c: Ctx) -> Fact:
    inc = SHARED_IDS["inc"].get(c.key()) or f"INC-{digits(c.rng, 5)}"
    c.state["inc"] = inc
    who = c.pick(IT_PEOPLE)
    vpn = c.pick(VPN_CLIENTS)
    mins = c.rng.choice([5, 10, 15, 20, 30])
    q = c.pick(
        [
            f"IT opened {inc} for my laptop — the {vpn} VPN drops every {mins} minutes since last "
            f"week's update. {who} said to try a wired connection, which didn't help. Ideas?",
            f"Ticket {inc}: my {vpn} tunnel disconnects roughly every {mins} minutes since the "
            f"update. {who} is on it but I'm blocked on deploys. Anything I can try myself?",
        ]
    )
    a = para(
        f"A disconnect on a fixed {mins}-minute cycle usually points to a rekey or keepalive "
        "timeout rather than Wi-Fi.",
        f"Things you can safely try: check whether the {vpn} client version changed in the "
        "update and whether the MTU was reset (setting it to 1380 often helps), turn off the "
        "laptop's power-saving mode for the network adapter, and collect the client log right "
        "after a drop.",
        f"Attach that log to {inc} so {who} can see the exact disconnect reason.",
        extra(c, "work"),
    )
    return Fact(
        turns=[(q, a)],
        target=[0],
        ids=[inc],
        queries={
            "exact_id": [f"{inc}", f"what's the latest on {inc}?", f"what did we try for {inc}"],
            "keyword": [f"{vpn} drops MTU 1380", f"{vpn} keepalive rekey"],
            "paraphrase": [
                "why does my work computer lose its remote office link?",
                "my secure passage into the company LAN cuts out — what can I attempt?",
            ],
            "mixed": [f"what did {who.split()[0]} suggest for my connectivity problem?"],
        },
    )


@template("printer_ticket", "work", needs="it_ticket")
def t_printer_ticket(c: Ctx) -> Fact:
    base = str(c.state.get("inc") or f"INC-{digits(c.rng, 5)}")
    inc2 = near_digits(c.rng, base)
    floor = c.rng.randint(2, 9)
    q = (
        f"Logged {inc2} because the badge printer on floor {floor} jams on every third card. "
        "Facilities says it's IT's problem. How do I get someone to own it?"
    )
    a = para(
        f"Put the impact in {inc2} in plain words: how many visitors or new starters are waiting "
        "for badges each day and what the workaround costs.",
        "Then ask the service desk to assign it to a named resolver group instead of leaving it "
        "in the shared queue, and copy the facilities lead so both sides see the same thread.",
        "A photo of a jammed card helps more than a description.",
        extra(c, "work"),
    )
    return Fact(
        turns=[(q, a)],
        target=[0],
        ids=[inc2],
        queries={
            "exact_id": [f"{inc2}", f"update on {inc2}"],
            "keyword": ["badge printer jams facilities", f"badge printer floor {floor}"],
            "paraphrase": ["the machine for entry passes gets stuck — who should repair it?"],
        },
    )


@template("purchase_order", "work")
def t_purchase_order(c: Ctx) -> Fact:
    base = digits(c.rng, 4)
    letters = c.rng.sample("ABCDEFGH", 2)
    po, po2 = f"PO-{base}-{letters[0]}", f"PO-{base}-{letters[1]}"
    c.state["po2"] = po2
    items = c.pick(PO_ITEMS)
    c.state["po_items"] = items
    vendor = c.pick(VENDORS)
    c.state["vendor"] = vendor
    qty = c.rng.randint(6, 40)
    amount = c.money(qty * 150, qty * 600, 10)
    date = c.date(7, 30)
    q = (
        f"Finance approved {po} for {qty} {items[0]} from {vendor}, total {amount}. Delivery is "
        f"expected {date}. What should I check when the pallet arrives?"
    )
    a = para(
        "Before signing for it, count the boxes against the packing slip and photograph any "
        "damaged cartons with the courier still there.",
        f"Match the serial numbers to the {vendor} invoice and note them against {po} in the "
        "asset register, then keep the packing slip until finance has closed the order.",
        f"If fewer than {qty} arrive, sign 'received short' rather than a clean signature.",
        extra(c, "work"),
    )
    return Fact(
        turns=[(q, a)],
        target=[0],
        ids=[po],
        queries={
            "exact_id": [f"{po}", f"what was {po} for?", f"when does {po} arrive"],
            "keyword": [f"{vendor} {items[0]} delivery", "packing slip received short"],
            "paraphrase": ["what kit did accounting okay for the team, and when does it show up?"],
            "mixed": [f"how many {items[0].split()[-1]} is {vendor} shipping us?"],
        },
    )


@template("purchase_order_2", "work", needs="purchase_order")
def t_purchase_order_2(c: Ctx) -> Fact:
    po2 = str(c.state.get("po2") or f"PO-{digits(c.rng, 4)}-C")
    items = c.state.get("po_items") or c.pick(PO_ITEMS)
    vendor = str(c.state.get("vendor") or c.pick(VENDORS))
    qty = c.rng.randint(6, 40)
    q = (
        f"Separate order {po2} for {qty} {items[1]} from {vendor} got stuck in approval because "  # type: ignore[index]
        "the cost centre is wrong. How do I fix it without starting over?"
    )
    a = para(
        f"Most procurement tools let the requester edit the cost centre on {po2} while it is "
        "still pending; the approval chain then restarts from the first approver, which is "
        "faster than a new request.",
        "If the field is locked, ask the procurement team to reject it back to you with a "
        "comment rather than cancelling it, so the quote stays attached.",
        extra(c, "work"),
    )
    return Fact(
        turns=[(q, a)],
        target=[0],
        ids=[po2],
        queries={
            "exact_id": [f"{po2}", f"why is {po2} stuck?"],
            "keyword": [f"{items[1]} cost centre approval"],  # type: ignore[index]
            "paraphrase": [
                "an item I bought for work is held up because the budget code is incorrect"
            ],
        },
    )


@template("project_cutover", "work")
def t_project_cutover(c: Ctx) -> Fact:
    code = c.pick(CODENAMES)
    system, target = c.pick(SYSTEMS)
    mgr = c.p["manager"]
    date = c.date(20, 90)
    q = c.pick(
        [
            f"Project {code} update: we're moving {system} to {target}, and {mgr} just pushed the "
            f"cutover to {date}. Help me write a status note for stakeholders?",
            f"{mgr} moved the {code} cutover to {date} ({system} onto {target}). I need a short "
            "status note that doesn't sound like we're slipping for no reason.",
        ]
    )
    a = para(
        f"Here's a draft:\n\nProject {code} — status\nThe cutover of {system} to {target} is now "
        f"planned for {date}. The extra time lets us finish load testing and a full rehearsal "
        "of the rollback, which we judged more important than the original date. No change to "
        "scope. Next checkpoint: end of next week.\n\n",
        "Keep it factual; the rehearsal is a good reason and stakeholders generally prefer a "
        "rehearsed cutover to an early one.",
        extra(c, "work", 1),
    )
    return Fact(
        turns=[(q, a)],
        target=[0],
        queries={
            "keyword": [f"{code} cutover status note", f"{code} rollback rehearsal"],
            "paraphrase": [
                "when is the big platform switch at my job happening now?",
                "what's the revised go-live day of that migration my boss delayed?",
            ],
            "mixed": [f"when does {code} go live?"],
        },
    )


@template("perf_review", "work")
def t_perf_review(c: Ctx) -> Fact:
    mgr = c.p["manager"]
    date = c.date(3, 20)
    skill = c.pick(
        [
            ("presenting at all-hands", "speaking up in front of large groups"),
            ("delegating", "handing off tasks instead of doing everything myself"),
            ("writing design docs earlier", "putting proposals on paper before coding"),
        ]
    )
    q = (
        f"My review with {mgr} is on {date}. Last time the feedback was that I should get better "
        f"at {skill[0]}. How do I show progress on that?"
    )
    a = para(
        "Bring two or three concrete examples from this cycle, each with what you did and what "
        "changed because of it.",
        f"For {skill[0]}, numbers help: how many times, for which audience, and any feedback "
        "you got afterwards.",
        f"Then ask {mgr} directly what 'good' would look like by the next review, so the target "
        "is shared.",
        extra(c, "work"),
    )
    return Fact(
        turns=[(q, a)],
        target=[0],
        queries={
            "keyword": [f"review feedback {skill[0]}"],
            "paraphrase": [
                "what area did my boss want me to grow in?",
                "which weakness of mine came up in my previous appraisal?",
            ],
            "mixed": [f"when do I meet {mgr} for my evaluation?"],
        },
    )


@template("jira_timezone", "software")
def t_jira_timezone(c: Ctx) -> Fact:
    proj = c.pick(["BILL", "OPS", "RPT", "CORE", "SHIP"])
    jira = f"{proj}-{digits(c.rng, 4)}"
    tz = c.pick(["America/Chicago", "Europe/Berlin", "Australia/Sydney", "Asia/Kolkata"])
    q = (
        f"{jira}: the monthly report shows every timestamp in UTC instead of the customer's "
        f"zone — a customer in {tz} sees yesterday's orders as today's. Python 3.11, "
        "stored as naive datetimes. Best fix?"
    )
    a = para(
        "Store timestamps as timezone-aware UTC (or mark the naive ones as UTC on read), and "
        "convert only at the edge where the report is rendered.",
        f"With zoneinfo: ts.replace(tzinfo=timezone.utc).astimezone(ZoneInfo('{tz}')).",
        "Group by the local date after conversion, not before — that's what moves orders "
        "across midnight.",
        f"Add a test to {jira} with an order at 23:30 local time on the last day of a month.",
        extra(c, "software"),
    )
    return Fact(
        turns=[(q, a)],
        target=[0],
        ids=[jira],
        queries={
            "exact_id": [f"{jira}", f"how did we fix {jira}?"],
            "keyword": ["zoneinfo naive datetimes report", f"{tz} report UTC"],
            "paraphrase": [
                "the bug where overseas buyers saw purchases land on the wrong "
                "calendar page because of clock offsets",
                "why did the statement list sales too soon for people overseas",
            ],
        },
    )


# ----------------------------------------------------------------------------- software


@template("pg_deadlock", "software")
def t_pg_deadlock(c: Ctx) -> Fact:
    svc = c.pick(SERVICES)
    table = c.pick(TABLES)
    q = (
        f"Our {svc} worker logs 'ERROR: deadlock detected' (SQLSTATE 40P01) a few times an hour "
        f"when two jobs update overlapping rows in {table}. Postgres 16. What's the proper fix, "
        "not just a retry?"
    )
    a = para(
        "Deadlocks like this come from two transactions taking row locks in different orders.",
        f"The real fix is a consistent order: before updating, lock the rows with SELECT ... FROM "
        f"{table} WHERE id = ANY(%s) ORDER BY id FOR UPDATE, so every job acquires them "
        "lowest-id first.",
        "Keep the transactions short and do no network calls while holding the locks.",
        "A bounded retry on 40P01 is still worth keeping as a safety net, with jitter.",
        extra(c, "software"),
    )
    return Fact(
        turns=[(q, a)],
        target=[0],
        ids=["40P01"],
        queries={
            "exact_id": ["40P01 fix", "what did we decide about the 40P01 errors?"],
            "keyword": [f"deadlock detected {table} FOR UPDATE", f"{svc} deadlock"],
            "paraphrase": [
                "how did we stop background tasks from blocking each other forever in the database?"
            ],
            "mixed": [f"{svc} jobs waiting on each other — the right cure?"],
        },
    )


@template("docker_oom", "software")
def t_docker_oom(c: Ctx) -> Fact:
    svc = c.pick(SERVICES)
    limit = c.pick(["512Mi", "768Mi", "1Gi", "256Mi"])
    q = (
        f"The {svc} container keeps dying with exit code 137 during the nightly import. Limit "
        f"is {limit}. Nothing in the app logs. What's going on?"
    )
    a = para(
        f"Exit code 137 is SIGKILL, and with a {limit} limit and silent app logs it's almost "
        "certainly the kernel OOM killer: kubectl describe pod will show 'OOMKilled' as the last "
        "state.",
        "The nightly import probably loads the whole file into memory; stream it in batches "
        "instead, or raise the limit to cover the measured peak plus headroom.",
        "Set the runtime's own heap cap below the container limit so the app fails with a "
        "readable error before the kernel steps in.",
        extra(c, "software"),
    )
    return Fact(
        turns=[(q, a)],
        target=[0],
        ids=["137"],
        queries={
            "exact_id": ["exit code 137", f"why does {svc} exit with 137?"],
            "keyword": ["OOMKilled nightly import", f"{svc} {limit} limit"],
            "paraphrase": [
                "why did my program get terminated after midnight while ingesting lots of records?"
            ],
        },
    )


@template("git_secret", "software")
def t_git_secret(c: Ctx) -> Fact:
    sha = "".join(c.rng.choice("0123456789abcdef") for _ in range(7))
    while sha.isdigit() or sha.isalpha():
        sha = "".join(c.rng.choice("0123456789abcdef") for _ in range(7))
    branch = c.pick(BRANCHES)
    q = (
        f"I accidentally committed an AWS access key in {sha} on {branch} and pushed it. The repo "
        "is private. How bad is this and what do I do first?"
    )
    a = para(
        "Treat it as leaked even though the repo is private: forks, CI caches and clones may "
        "already hold it.",
        "First deactivate and rotate the key in IAM, then check CloudTrail for any use of it "
        "since the push.",
        f"Only after that, rewrite history with git filter-repo to drop the file from {sha} "
        f"onwards, force-push {branch}, and ask everyone with a clone to re-clone.",
        "Add a pre-commit secret scanner so it can't happen silently again.",
        extra(c, "software"),
    )
    return Fact(
        turns=[(q, a)],
        target=[0],
        ids=[sha],
        queries={
            "exact_id": [f"{sha}", f"what was wrong with commit {sha}?"],
            "keyword": ["AWS access key filter-repo", f"{branch} force-push rotate key"],
            "paraphrase": ["what did I do after my credentials ended up in source control?"],
        },
    )


@template("flask_keyerror", "software")
def t_flask_keyerror(c: Ctx) -> Fact:
    ep = c.pick(ENDPOINTS)
    key = c.pick(PAYLOAD_KEYS)
    q = (
        f"My Flask endpoint /api/{ep} raises KeyError: '{key}' but only for calls from the "
        "mobile app. Works fine from Postman. Why?"
    )
    a = para(
        f"The mobile client is almost certainly omitting '{key}' (or sending it as null and a "
        "serializer is dropping it), and the handler indexes the dict directly.",
        f"Validate the body at the edge with a schema (pydantic or marshmallow) so a missing "
        f"'{key}' becomes a 400 with a clear message instead of a 500.",
        "Log the raw body for one failing call to confirm what the app actually sends.",
        extra(c, "software"),
    )
    return Fact(
        turns=[(q, a)],
        target=[0],
        queries={
            "keyword": [f"KeyError {key} Flask", f"/api/{ep} KeyError mobile"],
            "paraphrase": [
                "why did that web route blow up for smartphone users whenever a "
                "property was absent?"
            ],
            "mixed": [f"the {ep} crash for iPhone users — what caused it?"],
        },
    )


@template("node_econnreset", "software")
def t_node_econnreset(c: Ctx) -> Fact:
    ver = c.pick(["18", "20", "22"])
    api = c.pick(
        ["the payments API", "our geocoding provider", "the inventory service", "the SMS gateway"]
    )
    q = (
        f"Node {ver} service calling {api} gets ECONNRESET under load, around 200 requests per "
        "second. Below that it's fine."
    )
    a = para(
        "That pattern usually means sockets are being reused after the other side has closed "
        "them, or you're opening a new TLS session per request.",
        "Use one shared keep-alive agent (or undici's Pool) with a bounded maxSockets, and set "
        "its keepAliveTimeout below the upstream's idle timeout.",
        "Retry idempotent calls once on ECONNRESET with a little backoff.",
        extra(c, "software"),
    )
    return Fact(
        turns=[(q, a)],
        target=[0],
        ids=["ECONNRESET"],
        queries={
            "exact_id": ["ECONNRESET", "what fixed the ECONNRESET errors?"],
            "keyword": ["keepAliveTimeout maxSockets undici", f"Node {ver} keep-alive agent"],
            "paraphrase": [
                "why did the JavaScript backend lose outbound connections when traffic spiked?"
            ],
        },
    )


@template("slow_query", "software")
def t_slow_query(c: Ctx) -> Fact:
    table = c.pick(TABLES)
    secs = c.rng.choice([4, 7, 11, 18, 26])
    q = (
        f"This query on {table} takes {secs} seconds: WHERE tenant_id = $1 AND created_at > "
        "now() - interval '7 days' ORDER BY created_at DESC LIMIT 50. EXPLAIN shows a Seq Scan "
        "over 40 million rows."
    )
    a = para(
        f"Create a composite index on {table} (tenant_id, created_at DESC). The planner can then "
        "walk the index for one tenant in order and stop after 50 rows.",
        "Build it CONCURRENTLY so writes aren't blocked, and run ANALYZE afterwards.",
        f"You should see it drop from {secs} seconds to a few milliseconds.",
        extra(c, "software"),
    )
    return Fact(
        turns=[(q, a)],
        target=[0],
        queries={
            "keyword": [f"Seq Scan {table} composite index", "index CONCURRENTLY ANALYZE"],
            "paraphrase": ["how did we make that sluggish lookup fast again?"],
            "mixed": [f"speeding up the {table} lookup"],
        },
    )


# ----------------------------------------------------------------------------- health


@template("allergy", "health")
def t_allergy(c: Ctx) -> Fact:
    allergen, allergen_adj, dish = c.pick(ALLERGENS)
    q = c.pick(
        [
            f"I'm allergic to {allergen} — properly, EpiPen allergic. Can you suggest a {dish} "
            "recipe that works without them?",
            f"Quick one: {dish} for dinner, but I have a serious {allergen_adj} allergy. What do I swap?",
        ]
    )
    a = para(
        f"Absolutely. For {dish} without {allergen}, the trick is to replace the richness and "
        "texture they usually bring.",
        c.pick(
            [
                "Sunflower seed butter thinned with lime juice and a little soy sauce gives a "
                "similar creamy coating.",
                "Toasted pumpkin seeds add crunch, and a splash of coconut milk brings body.",
                "Roasted vegetables and a good stock carry most of the depth on their own.",
            ]
        ),
        "Check every packaged sauce label for 'may contain' warnings, and keep your EpiPen within "
        "reach when trying a new product.",
        extra(c, "cooking"),
    )
    return Fact(
        turns=[(q, a)],
        target=[0],
        queries={
            "keyword": [f"{allergen} allergy {dish}", f"EpiPen {allergen}"],
            "paraphrase": [
                "what food can't I eat?",
                "which ingredient could put me in hospital?",
                "what am I intolerant of, diet-wise?",
            ],
            "mixed": [f"{dish}: what did I have to leave out?"],
        },
    )


@template("medication", "health")
def t_medication(c: Ctx) -> Fact:
    med, dose, cond = c.pick(MEDS)
    doc = c.p["doctor"]
    q = (
        f"Dr. {doc} put me on {med} {dose} mg every morning for {cond}. Can I take it with "
        "coffee, or should I wait?"
    )
    a = para(
        f"For {med}, the usual advice is to be consistent about timing every day; some versions "
        "are absorbed less well with coffee or a meal, so many people take it with water and "
        "wait 30 to 60 minutes.",
        f"Because that depends on the exact formulation, confirm with Dr. {doc} or the "
        "pharmacist, and mention any supplements you take.",
        extra(c, "health"),
    )
    return Fact(
        turns=[(q, a)],
        target=[0],
        queries={
            "keyword": [f"{med} {dose} mg coffee", f"{med} timing"],
            "paraphrase": [
                "what pill do I swallow before breakfast, and how strong is it?",
                "which prescription am I on daily?",
            ],
            "mixed": [f"what did Dr. {doc} prescribe me?"],
        },
    )


@template("half_marathon", "health")
def t_half_marathon(c: Ctx) -> Fact:
    race = c.pick(RACES)
    date = c.date(40, 120)
    goal = c.pick(["1:55", "2:05", "1:48", "2:15", "1:59"])
    q = (
        f"I signed up for the {race} half marathon on {date}. Goal is under {goal}. I run "
        "Tuesdays, Thursdays and a long run Sundays. How should I build up?"
    )
    a = para(
        f"With three runs a week you can get there: keep Tuesday easy, make Thursday the quality "
        f"session (tempo or intervals at goal pace for {goal}), and add 1–2 km to the Sunday run "
        "each week, cutting back every fourth week.",
        "Peak long run around 18–19 km three weeks out, then taper.",
        "Practise race-day breakfast and gels on the long runs, not on the day.",
        extra(c, "health"),
    )
    return Fact(
        turns=[(q, a)],
        target=[0],
        queries={
            "keyword": [f"{race} half marathon", "tempo intervals taper long run"],
            "paraphrase": [
                "what finishing clock am I aiming for in the 21k?",
                "when is that 21k event I entered?",
            ],
            "mixed": [f"{race}: how fast do I want to go?"],
        },
    )


@template("physio", "health")
def t_physio(c: Ctx) -> Fact:
    who = c.pick(PHYSIOS)
    part, dx, plain = c.pick(BODY)
    q = (
        f"Physio {who} says my {part} pain is {dx} — {plain}, basically. I got three exercises "
        "and was told to skip running downhill for a month. Can you turn that into a plan?"
    )
    a = para(
        "Here's a simple weekly plan: do the three exercises on alternate days, slowly, stopping "
        "at mild discomfort (3/10) rather than pain.",
        f"On the other days, do low-impact cardio like cycling or swimming so the {part} keeps "
        "moving without load spikes.",
        f"Keep a note of pain the morning after each session and take it to {who} at the next "
        "appointment.",
        extra(c, "health"),
    )
    return Fact(
        turns=[(q, a)],
        target=[0],
        queries={
            "keyword": [f"physio {dx}", f"{who} three exercises {part}"],
            "paraphrase": ["what's wrong with my sore joint according to the therapist?"],
            "mixed": [f"what did {who} diagnose?"],
        },
    )


@template("sleep_rules", "health")
def t_sleep_rules(c: Ctx) -> Fact:
    hour = c.pick(["9:30pm", "10pm", "10:30pm", "11pm"])
    q = (
        f"I keep waking at 3am and can't drop off again. I've decided: no screens after {hour}, "
        "no caffeine after noon, and a fixed 6:45 alarm even on weekends. Anything to add?"
    )
    a = para(
        "That's a solid set of rules. Two additions with good evidence: get outside light within "
        "an hour of the alarm, and if you're awake for more than 20 minutes at 3am, get up and "
        "read something dull in dim light until drowsy.",
        "Keep the bedroom cool and use the bed only for sleep, so the brain relearns the "
        "association.",
        extra(c, "health"),
    )
    return Fact(
        turns=[(q, a)],
        target=[0],
        queries={
            "keyword": [f"no screens after {hour} caffeine", "waking at 3am alarm weekends"],
            "paraphrase": [
                "what nightly habits did I commit to so I rest well?",
                "my plan for insomnia",
            ],
        },
    )


@template("dentist", "health")
def t_dentist(c: Ctx) -> Fact:
    dentist = c.pick(DENTISTS)
    date = c.date(5, 40)
    tm = c.pick(["8:15", "9:40", "14:20", "16:05"])
    q = (
        f"Dentist appointment for the crown is {date} at {tm} with Dr. {dentist}. The temporary "
        "one feels loose. Should I call before then?"
    )
    a = para(
        "Yes — call the practice now. A loose temporary crown can let the prepared tooth shift or "
        "become sensitive, and they usually re-cement it in a few minutes.",
        "Until then, chew on the other side and avoid sticky food; a dab of over-the-counter "
        "temporary dental cement from a pharmacy can hold it for a day or two.",
        extra(c, "health", 1),
    )
    return Fact(
        turns=[(q, a)],
        target=[0],
        queries={
            "keyword": [f"Dr. {dentist} crown", "temporary crown loose cement"],
            "paraphrase": [
                "when does the permanent cap get fitted?",
                "date of my next visit about the molar",
            ],
            "mixed": [f"when do I see Dr. {dentist}?"],
        },
    )


@template("blood_pressure", "health")
def t_blood_pressure(c: Ctx) -> Fact:
    sys_, dia = c.rng.randint(136, 152), c.rng.randint(86, 97)
    q = (
        f"My home readings this fortnight average {sys_}/{dia}. Dr. {c.p['doctor']} wants "
        "under 130/80 before deciding on medication. What lifestyle changes move the needle?"
    )
    a = para(
        "The big four, roughly in order of effect: cut sodium (aim for under 2 g a day), regular "
        "aerobic exercise (150 minutes a week), lose weight if there's some to lose, and limit "
        "alcohol.",
        "Measure at the same times each day, seated, after five quiet minutes, and keep the log "
        "for the next appointment.",
        extra(c, "health"),
    )
    return Fact(
        turns=[(q, a)],
        target=[0],
        queries={
            "keyword": [f"home readings {sys_}/{dia}", "sodium 130/80 readings"],
            "paraphrase": ["how high was my cardiovascular pressure figure lately?"],
            "mixed": [f"what target did Dr. {c.p['doctor']} set for my heart numbers?"],
        },
    )


# ----------------------------------------------------------------------------- travel


def trip(c: Ctx) -> tuple[str, str, str, str, str]:
    if "trip" not in c.state:
        c.state["trip"] = c.pick(TRIPS)
    return c.state["trip"]  # type: ignore[return-value]


@template("flight_booking", "travel")
def t_flight_booking(c: Ctx) -> Fact:
    city, country, airline, code, _ = trip(c)
    pnr = upper_alnum(c.rng, 6)
    flight = f"{code}{c.rng.randint(100, 9899)}"
    date = c.date(20, 100)
    seat = f"{c.rng.randint(8, 39)}{c.pick('ACDF')}"
    q = (
        f"Booked! {airline} {flight} to {city} on {date}, booking reference {pnr}, seat {seat}. "
        "What should I do between now and departure?"
    )
    a = para(
        f"Congrats! A short checklist: add {pnr} to the {airline} app so gate changes reach you, "
        f"check-in opens 24 hours before {flight}, and confirm the baggage allowance on your fare.",
        f"Check {country}'s entry rules for your passport and whether you need any registration "
        "before arrival.",
        "Set a reminder a week out to buy travel insurance if you haven't.",
        extra(c, "travel"),
    )
    return Fact(
        turns=[(q, a)],
        target=[0],
        ids=[pnr, flight],
        queries={
            "exact_id": [f"{pnr}", f"booking {pnr}", f"when does {flight} leave?"],
            "keyword": [f"{airline} {city} booking reference", f"{airline} seat {seat}"],
            "paraphrase": ["when does my plane take off for the holiday overseas?"],
            "mixed": [f"when am I flying to {city}?"],
        },
    )


@template("hotel_booking", "travel")
def t_hotel_booking(c: Ctx) -> Fact:
    city, *_ = trip(c)
    hotel = c.pick(HOTELS)
    conf = f"HC{digits(c.rng, 7)}"
    date = c.date(20, 100)
    nights = c.rng.randint(3, 9)
    q = (
        f"Hotel for {city} is {hotel}, confirmation {conf}, check-in {date} for {nights} nights. "
        "I asked for a quiet room away from the elevator. Should I confirm that again?"
    )
    a = para(
        f"Yes, a short email to {hotel} a few days before arrival quoting {conf} helps: requests "
        "made through booking sites often don't reach the front desk.",
        "Ask for a high floor on the courtyard side, and mention it again at check-in.",
        extra(c, "travel"),
    )
    return Fact(
        turns=[(q, a)],
        target=[0],
        ids=[conf],
        queries={
            "exact_id": [f"{conf}", f"what is booking {conf}?"],
            "keyword": [f"{hotel} quiet room elevator"],
            "paraphrase": ["where am I staying on vacation and what did I want regarding noise?"],
            "mixed": [f"where am I sleeping in {city}?"],
        },
    )


@template("passport", "travel")
def t_passport(c: Ctx) -> Fact:
    _, country, *_ = trip(c)
    exp = fmt_date(c.rng, c.now + timedelta(days=c.rng.randint(120, 200)))
    q = (
        f"My passport expires {exp}. I'm going to {country} in a couple of months — some sites "
        "say six months' validity is required. Do I need to renew first?"
    )
    a = para(
        f"Rules differ: some countries want six months beyond arrival, others only for the "
        f"length of stay. Check {country}'s official government entry page rather than a "
        "booking site.",
        f"With an expiry of {exp} you are close enough that renewing now is the safe choice; "
        "standard processing can take several weeks, so apply this week.",
        extra(c, "travel"),
    )
    return Fact(
        turns=[(q, a)],
        target=[0],
        queries={
            "keyword": [f"passport expires {country} six months validity"],
            "paraphrase": [
                "will my ID still be okay for the international trip?",
                "when does my travel ID run out?",
            ],
            "mixed": [f"can I get into {country} on my current papers?"],
        },
    )


@template("frequent_flyer", "travel")
def t_frequent_flyer(c: Ctx) -> Fact:
    _, _, airline, *_ = trip(c)
    ff = f"FF{digits(c.rng, 8)}"
    meal = c.pick(["vegetarian", "gluten-free", "low-salt"])
    q = (
        f"For future bookings: my {airline} frequent flyer number is {ff}, I always want an "
        f"aisle seat, never the middle, and a {meal} meal. Can you remember that?"
    )
    a = para(
        f"Noted: {airline} number {ff}, aisle seat, {meal} meal.",
        "When booking through a third-party site, add the number on the passenger page — it's "
        "often hidden under 'optional' — and recheck the meal on the airline's own site after "
        "ticketing, because agencies don't always pass it on.",
        extra(c, "travel", 1),
    )
    return Fact(
        turns=[(q, a)],
        target=[0],
        ids=[ff],
        queries={
            "exact_id": [f"{ff}", f"whose number is {ff}?"],
            "keyword": [f"{airline} frequent flyer aisle {meal}"],
            "paraphrase": [
                "which spot on a jet do I prefer?",
                "my loyalty scheme membership details for plane trips",
            ],
        },
    )


# ----------------------------------------------------------------------------- cooking


@template("sourdough", "cooking")
def t_sourdough(c: Ctx) -> Fact:
    name = c.pick(STARTERS)
    hyd = c.pick(["70", "75", "78", "80"])
    q = (
        f"My starter, {name}, has gone sluggish — it used to double in 5 hours, now it takes 10. "
        f"I feed it 1:5:5 and bake at {hyd}% hydration. Kitchen is about 18°C."
    )
    a = para(
        "At 18°C a 1:5:5 feed is simply a lot of fresh flour for the culture to work through; "
        "either drop to 1:2:2 for a few days or find a warmer spot around 24–26°C (the oven with "
        "only the light on works).",
        "A spoon of whole rye in each feed speeds it up noticeably.",
        f"Once it's doubling reliably again, your {hyd}% loaves will get their oven spring back.",
        extra(c, "cooking"),
    )
    return Fact(
        turns=[(q, a)],
        target=[0],
        queries={
            "keyword": [f"{name} starter sluggish", f"1:5:5 feed {hyd}% hydration"],
            "paraphrase": ["what is my leaven jar called?", "why is my levain slow lately?"],
            "mixed": [f"how wet is my dough with {name}?"],
        },
    )


@template("partner_vegetarian", "cooking")
def t_partner_veg(c: Ctx) -> Fact:
    partner = c.p["partner"]
    month = c.pick(["January", "March", "May", "September", "October"])
    q = (
        f"{partner} went vegetarian in {month}, and I'm still cooking two versions of every "
        "dinner. Can you plan five weeknight meals we can both enjoy?"
    )
    a = para(
        "Here are five that work as one pot for both of you:",
        "\n1. Black bean and sweet potato tacos with lime slaw.\n2. Mushroom and lentil ragù over "
        "pappardelle.\n3. Chickpea and spinach curry with rice.\n4. Halloumi traybake with "
        "peppers and couscous.\n5. Miso-glazed tofu with sesame greens.\n",
        "If you want meat on a given night, cook it separately as a side and keep the main dish "
        "vegetarian.",
        extra(c, "cooking"),
    )
    return Fact(
        turns=[(q, a)],
        target=[0],
        queries={
            "keyword": [f"vegetarian weeknight meals {partner}", "lentil ragù halloumi traybake"],
            "paraphrase": [
                "who in my household stopped eating animals?",
                "which person I live with quit steak and poultry?",
            ],
            "mixed": [f"what can {partner} not have for supper?"],
        },
    )


@template("birthday_cake", "cooking")
def t_birthday_cake(c: Ctx) -> Fact:
    kid = c.p["kid"]
    age = c.rng.randint(5, 11)
    date = c.date(7, 40)
    n = c.rng.randint(8, 18)
    hot = c.pick(["15", "20", "10"])
    q = (
        f"{kid} turns {age} on {date} and wants a chocolate cake for {n} kids. My oven runs about "
        f"{hot} degrees hot. Recipe and adjustments?"
    )
    a = para(
        f"For {n} kids a 23×33 cm sheet cake is easiest. Classic one-bowl chocolate: 2 cups flour, "
        "2 cups sugar, 3/4 cup cocoa, 2 tsp baking soda, 1 tsp salt, 2 eggs, 1 cup buttermilk, "
        "1/2 cup oil, 1 cup hot coffee.",
        f"Set the dial {hot} degrees lower than the recipe's 175°C and start checking at 30 "
        "minutes; a skewer should come out with a few moist crumbs.",
        "Frost once fully cool — chocolate buttercream is the crowd favourite.",
        extra(c, "cooking", 1),
    )
    return Fact(
        turns=[(q, a)],
        target=[0],
        queries={
            "keyword": [f"chocolate sheet cake {n} kids", "buttermilk cocoa skewer buttercream"],
            "paraphrase": [
                "by how much does my stove overshoot the temperature?",
                "what dessert am I preparing for my child's party?",
            ],
            "mixed": [f"what's the plan for {kid}'s party dessert?"],
        },
    )


@template("cilantro", "cooking")
def t_cilantro(c: Ctx) -> Fact:
    q = (
        "I hate cilantro — it tastes like soap to me, always has. Give me a fresh salsa for "
        "Friday tacos that doesn't need it."
    )
    a = para(
        "Try a charred corn and tomato salsa: blister two corn cobs, cut off the kernels, and mix "
        "with diced tomato, red onion, jalapeño, lime juice and salt.",
        "Use flat-leaf parsley and a few mint leaves for the green note instead; chives work too.",
        "Let it sit 15 minutes before serving so the lime softens the onion.",
        extra(c, "cooking"),
    )
    return Fact(
        turns=[(q, a)],
        target=[0],
        queries={
            "keyword": ["cilantro soap salsa", "charred corn salsa parsley"],
            "paraphrase": ["which herb do I find disgusting?", "what garnish do I refuse to eat?"],
        },
    )


# ----------------------------------------------------------------------------- shopping


@template("shoe_return", "shopping")
def t_shoe_return(c: Ctx) -> Fact:
    order = f"ORD-{digits(c.rng, 7)}"
    brand = c.pick(SHOE_BRANDS)
    base = f"{c.pick(['RN', 'TR', 'WL'])}-{digits(c.rng, 4)}"
    sku = f"{base}-BLK"
    c.state["sku_base"] = base
    c.state["shoe_brand"] = brand
    size = c.pick(["9.5", "10", "8", "11", "42", "44"])
    q = (
        f"Returning order {order} — the {brand} running shoes, SKU {sku}, are half a size too "
        f"small. I want to exchange for size {size}, not a refund. How?"
    )
    a = para(
        f"Most shops handle an exchange as a return plus a new order. Start the return for "
        f"{order} on the retailer's site and choose 'exchange' if offered; otherwise order size "
        f"{size} of {sku} now so stock doesn't run out, and refund the original when it arrives "
        "back.",
        "Don't run outdoors in the pair you're sending back — most policies require unworn soles.",
        extra(c, "shopping"),
    )
    return Fact(
        turns=[(q, a)],
        target=[0],
        ids=[order, sku],
        queries={
            "exact_id": [f"{order}", f"what was {sku}?", f"status of {order}"],
            "keyword": [f"{brand} running shoes exchange", f"{brand} half a size too small"],
            "paraphrase": ["which trainers am I swapping, and why?"],
            "mixed": [f"the {brand} pair that didn't fit"],
        },
    )


@template("shoe_second_pair", "shopping", needs="shoe_return")
def t_shoe_second(c: Ctx) -> Fact:
    base = str(c.state.get("sku_base") or f"RN-{digits(c.rng, 4)}")
    brand = str(c.state.get("shoe_brand") or c.pick(SHOE_BRANDS))
    sku2 = f"{base}-WHT"
    partner = c.p["partner"]
    q = (
        f"Also ordered the same {brand} model in white for {partner}, SKU {sku2}. Is it worth "
        "paying extra for the stability version?"
    )
    a = para(
        "Only if there's a reason: stability models help runners whose feet roll inward a lot "
        "(overpronation) or who've had shin or knee trouble.",
        f"If {partner} is a neutral runner, the standard {sku2} is lighter and usually more "
        "comfortable. A quick gait check at a running shop settles it.",
        extra(c, "shopping"),
    )
    return Fact(
        turns=[(q, a)],
        target=[0],
        ids=[sku2],
        queries={
            "exact_id": [f"{sku2}", f"who is {sku2} for?"],
            "keyword": ["stability version overpronation white"],
            "paraphrase": ["should my other half's trainers have more arch support?"],
        },
    )


@template("washer_warranty", "shopping")
def t_washer(c: Ctx) -> Fact:
    brand = c.pick(APPLIANCE_BRANDS)
    sn = f"SN-{upper_alnum(c.rng, 4)}-{upper_alnum(c.rng, 4)}"
    bought = fmt_date(c.rng, c.now - timedelta(days=c.rng.randint(200, 650)))
    q = (
        f"Our {brand} washer (serial {sn}) leaks from the front door seal mid-cycle. Bought "
        f"{bought}, two-year warranty. What do I say when I call?"
    )
    a = para(
        f"Have the serial {sn}, the purchase date ({bought}) and the receipt ready.",
        "Describe it precisely: water appears at the front door seal during the wash phase, not "
        "during draining — that points the technician to the gasket rather than the pump.",
        "Ask for the visit reference and whether parts and labour are both covered.",
        extra(c, "shopping"),
    )
    return Fact(
        turns=[(q, a)],
        target=[0],
        ids=[sn],
        queries={
            "exact_id": [f"{sn}", f"which appliance is {sn}?"],
            "keyword": [f"{brand} washer door seal leaks", "gasket warranty technician"],
            "paraphrase": ["our laundry machine drips — is it still under guarantee?"],
        },
    )


# ----------------------------------------------------------------------------- family


@template("school_play", "family")
def t_school_play(c: Ctx) -> Fact:
    kid = c.p["kid"]
    role = c.pick(ROLES)
    date = c.date(10, 45)
    q = (
        f"{kid} got the part of {role} in the school play on {date}! I need to make a costume "
        "on a small budget and I can't sew. Ideas?"
    )
    a = para(
        f"Congratulations to {kid}! For {role}, build the costume from a base outfit in the "
        "right colour (charity shops are great) and add the recognisable details with felt, "
        "fabric glue and safety pins — no sewing needed.",
        "A cardboard prop and face paint do most of the work on stage, where details are hard to "
        "see anyway.",
        "Do a dress rehearsal at home a week before so nothing falls off on the night.",
        extra(c, "family"),
    )
    return Fact(
        turns=[(q, a)],
        target=[0],
        queries={
            "keyword": [f"{role} school play costume"],
            "paraphrase": [
                "what character is my child performing as?",
                "which role did my daughter or son land in the show?",
            ],
            "mixed": [f"who is {kid} acting as?"],
        },
    )


@template("parent_surgery", "family")
def t_parent_surgery(c: Ctx) -> Fact:
    par = c.p["parent"]
    surg, _ = c.pick(SURGERIES)
    hosp = c.pick(HOSPITALS)
    date = c.date(10, 50)
    days = c.rng.randint(3, 10)
    q = (
        f"My {par} has {surg} surgery at {hosp} on {date}. I'm taking {days} days off to help. "
        "What should we prepare at home?"
    )
    a = para(
        f"For recovery after {surg}, set up one ground-floor room with everything within reach, "
        "remove loose rugs, and put a sturdy chair with arms where they'll sit most.",
        f"Ask {hosp} for the discharge instructions in writing and who to call at night.",
        f"Plan simple meals for the {days} days in advance and write the medication times on a "
        "sheet on the fridge.",
        extra(c, "family"),
    )
    return Fact(
        turns=[(q, a)],
        target=[0],
        queries={
            "keyword": [f"{surg} {hosp}", f"{hosp} discharge instructions"],
            "paraphrase": [
                "when is my parent's operation?",
                "how long am I off looking after a relative who is healing?",
            ],
            "mixed": [f"what procedure is my {par} having?"],
        },
    )


@template("pet_vet", "family")
def t_pet_vet(c: Ctx) -> Fact:
    pet, breed = c.p["pet"], c.p["breed"]
    clinic = c.pick(VET_CLINICS)
    date = c.date(5, 30)
    q = (
        f"{pet} (our {breed}) is due boosters — {clinic} booked us for {date}. Last time {pet} "
        "was terrified in the waiting room. Any tips?"
    )
    a = para(
        "Ask the clinic for the first slot of the day or to wait in the car until they're ready, "
        "and bring a favourite blanket that smells of home.",
        f"A few 'happy visits' beforehand, where {pet} just gets a treat at reception and leaves, "
        "can take the edge off.",
        "Skip breakfast so treats are more motivating, unless the vet says otherwise.",
        extra(c, "family"),
    )
    return Fact(
        turns=[(q, a)],
        target=[0],
        queries={
            "keyword": [f"{clinic} boosters", f"{breed} waiting room terrified"],
            "paraphrase": ["when is my furry companion getting jabs?"],
            "mixed": [f"when does {pet} see the animal doctor?"],
        },
    )


@template("anniversary", "family")
def t_anniversary(c: Ctx) -> Fact:
    partner = c.p["partner"]
    n = c.rng.randint(3, 15)
    date = c.date(10, 60)
    thing, gift = c.pick(
        [
            ("jazz records", "a first pressing of a Blue Note album"),
            ("hiking", "a night in a mountain hut"),
            ("ceramics", "a weekend pottery workshop"),
            ("old maps", "a framed antique map of where we met"),
        ]
    )
    budget = c.money(150, 600, 25)
    q = (
        f"Our {n}th anniversary is {date}. {partner} loves {thing}, budget about {budget}. I'm "
        f"thinking {gift}. Good idea?"
    )
    a = para(
        f"Yes — {gift} is personal and ties to something {partner} already loves, which tends "
        "to land better than anything generic.",
        f"Keep a little of the {budget} for a handwritten card that says why you chose it.",
        "Order early if it needs framing or booking.",
        extra(c, "family"),
    )
    return Fact(
        turns=[(q, a)],
        target=[0],
        queries={
            "keyword": [f"anniversary {thing} gift"],
            "paraphrase": ["what present was I considering for my spouse's celebration?"],
            "mixed": [f"what was my gift idea for {partner}?"],
        },
    )


@template("plumber", "family")
def t_plumber(c: Ctx) -> Fact:
    ll = c.p["landlord"]
    name = c.pick(["Gary", "Imogen", "Raúl", "Dmitri", "Kezia"])
    date = c.date(1, 10)
    window = c.pick(["8–10am", "10am–noon", "1–3pm", "3–5pm"])
    q = (
        f"The plumber, {name}, comes {date} between {window} to fix the leak under the kitchen "
        f"sink. {ll} said he'd cover it. Should I get that in writing?"
    )
    a = para(
        f"Yes — a one-line email to {ll} confirming he's paying for {name}'s visit avoids an "
        "awkward conversation later.",
        "Clear the cupboard under the sink the night before and put a towel down, and take a "
        "photo of the damage for your own records.",
        extra(c, "family"),
    )
    return Fact(
        turns=[(q, a)],
        target=[0],
        queries={
            "keyword": ["plumber kitchen sink leak", f"{name} plumber"],
            "paraphrase": ["when is the tradesperson arriving to repair the dripping pipe?"],
            "mixed": [f"is {ll} footing the bill for the repair?"],
        },
    )


# ----------------------------------------------------------------------------- long turns
# Each puts its fact past character 4,000 of the turn text (question + answer), so the
# chunker (4,000 characters a chunk) places it in a later chunk.

LONG_MIN_OFFSET = 4300


def fill_until(c: Ctx, make_line: Callable[[], str], chars: int) -> list[str]:
    out: list[str] = []
    total = 0
    while total < chars:
        line = make_line()
        out.append(line)
        total += len(line) + 1
    return out


@template("build_log_long", "software", long=True)
def t_build_log(c: Ctx) -> Fact:
    build = digits(c.rng, 5)
    domain = c.pick(DOMAINS)
    svc = c.pick(SERVICES)
    t0 = c.now.replace(hour=2, minute=c.rng.randint(0, 50), second=0)
    clock = [t0]

    def ts() -> str:
        clock[0] += timedelta(seconds=c.rng.randint(1, 9))
        return clock[0].strftime("%H:%M:%S")

    steps = [
        "checkout",
        "restore-cache",
        "lint",
        "unit-tests",
        "integration-tests",
        "build-image",
        "scan-image",
    ]
    msgs = [
        "Fetching objects: {n}% ({m}/2391)",
        "Resolving deltas: {n}%",
        "cache hit for key deps-{h}",
        "PASSED tests/test_{w}.py::test_{w}_{v} [{n}%]",
        "ruff check . — All checks passed",
        "Step {m}/31 : RUN pip install --no-cache-dir -r requirements.txt",
        " ---> Using cache",
        " ---> {h}",
        "Collecting {w}-client>=2.{n}",
        "Downloading {w}_lib-1.{n}.0-py3-none-any.whl ({m} kB)",
        "mypy: Success: no issues found",
        "WARNING: deprecated option --{w}-mode will be removed in v4",
        "layer sha256:{h}{h}: Pushed",
        "Trivy: 0 CRITICAL, {n} MEDIUM in base layer",
    ]
    wordsl = ["ledger", "routing", "invoice", "schema", "parser", "retry", "export", "auth"]

    def line() -> str:
        m = c.pick(msgs).format(
            n=c.rng.randint(1, 99),
            m=c.rng.randint(10, 2390),
            h="".join(c.rng.choice("0123456789abcdef") for _ in range(8)),
            w=c.pick(wordsl),
            v=c.pick(wordsl),
        )
        return f"[{ts()}] [{c.pick(steps)}] {m}"

    head = [f"$ ci logs {svc} --last", f"Pipeline for {svc} @ main — triggered by push"]
    body = fill_until(c, line, 4400)
    fail = [
        f"[{ts()}] [push-image] Pushing to registry.{domain}/{svc} (pipeline {build})",
        f'[{ts()}] [push-image] Get "https://registry.{domain}/v2/": tls: failed to verify '
        f"certificate: x509: certificate has expired or is not yet valid: current time "
        f"{c.now.strftime('%Y-%m-%dT')}02:41:07Z is after {c.now.strftime('%Y-%m-')}01T00:00:00Z",
        f"[{ts()}] [push-image] ERROR: job failed: exit code 1",
    ]
    tail = fill_until(c, line, c.rng.randint(300, 1500))
    q = (
        "The deploy failed overnight and I can't see why in this wall of text. Here's the whole "
        "log:\n\n" + "\n".join(head + body + fail + tail) + "\n\nWhat broke?"
    )
    a = para(
        "The tests and image build all pass; the failure is in the very last stage.",
        "The runner could not talk to your container registry because the registry's TLS "
        "certificate has expired, so the push step aborted.",
        "Renew the certificate on the registry host (or the load balancer in front of it), then "
        "re-run only the last stage. Add an expiry alert at 30 days so it doesn't surprise you "
        "again.",
    )
    return Fact(
        turns=[(q, a)],
        target=[0],
        ids=[build],
        long=True,
        deep=f"(pipeline {build})",
        queries={
            "exact_id": [f"pipeline {build}", f"why did pipeline {build} fail?"],
            "keyword": [f"x509 certificate expired registry.{domain}"],
            "paraphrase": ["what stopped the release yesterday evening from publishing?"],
            "mixed": [f"{svc} deploy broke — what was the cause?"],
        },
    )


@template("meeting_notes_long", "work", long=True)
def t_meeting_notes(c: Ctx) -> Fact:
    legacy = c.pick(LEGACY)
    owner = c.p["colleague"]
    date = c.date(30, 75)
    people = [c.p["manager"], c.p["colleague"], "Rina", "Ollie", "Fatima", "Bea", "Joaquín"]
    sections = [
        "Roadmap review",
        "Hiring",
        "Incidents last sprint",
        "Customer feedback",
        "Budget",
        "On-call rota",
        "Data quality",
        "Vendor renewals",
    ]
    items = [
        "{p} walked through the Q{n} roadmap; two epics slip by one sprint because of the audit.",
        "{p} raised that the staging environment is often broken on Mondays; {p2} will add a "
        "smoke test to the weekend job.",
        "Open headcount: one senior engineer, one analyst. {p} is screening; {n} candidates in "
        "the pipeline.",
        "Incident review: the {n} minute outage on Thursday was a config push without a canary; "
        "action for {p}: make canaries mandatory.",
        "Customer feedback from the last {n} interviews: export is the top request, then SSO.",
        "{p2} asked whether we can consolidate the three monitoring tools; parked until the "
        "renewal dates are known.",
        "Budget: travel is {n}% under, cloud spend {n2}% over because of the backfill job.",
        "On-call: {p} swaps the week of the {n}th with {p2}.",
        "Data quality: duplicate rows in the nightly import traced to retries without "
        "idempotency keys; {p} owns the fix.",
        "{p} reminded everyone to fill in the engagement survey by Friday.",
        "Vendor renewals: the log platform contract ends in {n} weeks; {p2} is collecting quotes.",
        "Discussion about moving stand-up to 9:45 went nowhere; keep 9:30 for now.",
    ]

    def item() -> str:
        p, p2 = c.rng.sample(people, 2)
        return "- " + c.pick(items).format(
            p=p, p2=p2, n=c.rng.randint(2, 30), n2=c.rng.randint(3, 19)
        )

    parts: list[str] = []
    total = 0
    rounds = 0
    while total < 4600:
        sec = sections[rounds % len(sections)] + (" (continued)" if rounds >= len(sections) else "")
        rounds += 1
        block = [f"## {sec}"] + [item() for _ in range(c.rng.randint(3, 6))]
        parts.extend(block)
        total += sum(len(x) + 1 for x in block)
    decision = (
        f"- Decision: we sunset the {legacy} dashboard on {date}. {owner} owns the "
        "comms to the customers who still use it, and sends the notice two weeks "
        "before."
    )
    parts.append(decision)
    parts.extend(item() for _ in range(c.rng.randint(4, 9)))
    q = (
        "Can you pull the action items out of today's team meeting notes? Pasting them raw:\n\n"
        + "\n".join(parts)
    )
    a = para(
        "Here are the action items I can see, grouped by owner. Canaries become mandatory for "
        "config pushes; the weekend job gets a smoke test for staging; the nightly import gets "
        "idempotency keys; quotes are being collected for the log platform renewal; and everyone "
        "has the survey deadline on Friday.",
        "Let me know if you want these as tickets.",
    )
    return Fact(
        turns=[(q, a)],
        target=[0],
        long=True,
        deep=decision,
        queries={
            "keyword": [f"sunset {legacy} dashboard"],
            "paraphrase": [
                "who will tell clients that the legacy reporting view is being retired?"
            ],
            "mixed": [f"when do we switch off {legacy}?", f"what is {owner} telling customers?"],
        },
    )


@template("itinerary_long", "travel", long=True)
def t_itinerary(c: Ctx) -> Fact:
    city, country, _, _, island = trip(c)
    rest = c.pick(RESTAURANTS)
    surname = c.p["name"].split()[-1]
    dep = c.pick(["07:40", "08:15", "06:55", "09:05"])
    pier = c.rng.randint(2, 12)
    acts = [
        "Morning walking tour of the old quarter (meet at the fountain, about 2.5 hours).",
        "Lunch at a market hall — try whatever the locals are queueing for.",
        "Afternoon at the national museum; the modern wing is the highlight.",
        "Sunset viewpoint, then tapas-style dinner near the hotel.",
        "Day trip by train to the coast; bring swimwear and a light jacket.",
        "Cooking class 10:00–13:00, booked and paid.",
        "Free afternoon: bookshop, coffee, nap.",
        "Botanical garden, then the covered market for souvenirs.",
        "Guided cycling tour along the river, helmets provided.",
        "Evening concert in the cathedral; tickets on the phone.",
        "Slow morning. Laundry at the hotel. Afternoon at the thermal baths.",
        "Street-food crawl with a local guide, 18:30 start.",
    ]
    notes = [
        "Notes: pharmacies close early on Sundays here.",
        "Notes: tipping 5–10% in restaurants, rounding up for taxis.",
        "Notes: the transit card works on trams and the funicular.",
        "Notes: remember adaptor plugs and the charger for the camera.",
        "Notes: book the airport transfer the day before.",
    ]
    lines = [f"{city} & {country} — draft plan v3", ""]
    day = 1
    while sum(len(x) + 1 for x in lines) < 4500:
        lines.append(f"Day {day}:")
        lines.extend("  * " + a for a in c.rng.sample(acts, c.rng.randint(3, 5)))
        lines.append("  " + c.pick(notes))
        day += 1
    lines.append(f"Day {day}:")
    lines.append(
        f"  * Ferry to {island} departs {dep} from pier {pier} — be there 30 min early, "
        "tickets are not refundable."
    )
    lines.append(f"  * Dinner at {rest}, table for two at 20:00 booked under the name {surname}.")
    for d in range(day + 1, day + c.rng.randint(2, 4)):
        lines.append(f"Day {d}:")
        lines.extend("  * " + a for a in c.rng.sample(acts, 3))
    q = (
        "Here's my full draft plan for the trip. Does the pacing look realistic, or am I "
        "cramming too much in?\n\n" + "\n".join(lines)
    )
    a = para(
        "Overall it's a good plan, but a few days are heavy: three big sights plus an evening "
        "event leaves no slack for weather or tired legs.",
        "I'd move one museum visit to the free afternoon, keep one genuinely empty half-day in "
        "the middle, and avoid anything tightly timed on the day after arrival.",
        "The early departure later in the week deserves an early night before it.",
    )
    return Fact(
        turns=[(q, a)],
        target=[0],
        long=True,
        deep=f"Ferry to {island} departs {dep}",
        queries={
            "keyword": [f"{rest} table booked", f"ferry {island} pier"],
            "paraphrase": ["when does the boat sail on our holiday, and from which dock?"],
            "mixed": [
                f"{island}: when do we set sail?",
                f"under what name is our {rest} reservation?",
            ],
        },
    )


@template("lab_results_long", "health", long=True)
def t_lab_results(c: Ctx) -> Fact:
    doc = c.p["doctor"]
    ferritin = c.rng.randint(6, 14)
    analytes = [
        ("Sodium", "mmol/L", 135, 145),
        ("Potassium", "mmol/L", 3.5, 5.1),
        ("Chloride", "mmol/L", 98, 107),
        ("Urea", "mmol/L", 2.5, 7.8),
        ("Creatinine", "umol/L", 59, 104),
        ("eGFR", "mL/min/1.73m2", 90, 120),
        ("ALT", "U/L", 7, 56),
        ("AST", "U/L", 10, 40),
        ("ALP", "U/L", 44, 147),
        ("Bilirubin", "umol/L", 3, 21),
        ("Albumin", "g/L", 35, 50),
        ("Glucose (fasting)", "mmol/L", 3.9, 5.6),
        ("HbA1c", "mmol/mol", 20, 41),
        ("Total cholesterol", "mmol/L", 3.0, 5.0),
        ("LDL", "mmol/L", 1.0, 3.0),
        ("HDL", "mmol/L", 1.0, 2.2),
        ("Triglycerides", "mmol/L", 0.5, 1.7),
        ("TSH", "mIU/L", 0.4, 4.0),
        ("Free T4", "pmol/L", 12, 22),
        ("Haemoglobin", "g/L", 120, 160),
        ("WBC", "x10^9/L", 4.0, 11.0),
        ("Platelets", "x10^9/L", 150, 400),
        ("MCV", "fL", 80, 100),
        ("Vitamin B12", "ng/L", 200, 900),
        ("Folate", "ug/L", 3, 20),
        ("Vitamin D", "nmol/L", 50, 125),
        ("CRP", "mg/L", 0, 5),
    ]
    rows: list[str] = [f"PATIENT SUMMARY — requested by Dr. {doc}", "Specimen: serum, fasting", ""]
    order = analytes[:]
    c.rng.shuffle(order)
    comment_pool = [
        "Comment: haemolysis index within acceptable limits.",
        "Comment: result verified by second analyser.",
        "Comment: reference interval updated this year; see lab handbook.",
        "Comment: sample received at 09:12, analysed same day.",
    ]
    rounds = 0
    while sum(len(x) + 1 for x in rows) < 4400:
        rounds += 1
        rows.append(f"--- Panel {rounds} ---")
        for name, unit, lo, hi in order:
            val = round(c.rng.uniform(lo, hi), 1)
            rows.append(f"{name:<20} {val:>7} {unit:<14} ({lo}–{hi})")
        rows.append(c.pick(comment_pool))
        c.rng.shuffle(order)
    rows.append(f"Ferritin             {ferritin:>7} ug/L           (30–400)   L")
    rows.append(
        "Comment: ferritin below reference interval; consider oral iron and repeat in three months."
    )
    rows.extend(
        f"{n:<20} {round(c.rng.uniform(lo, hi), 1):>7} {u:<14} ({lo}–{hi})"
        for n, u, lo, hi in order[:6]
    )
    q = (
        "I got my annual bloods back and the portal just dumps this. Can you tell me if anything "
        "is worth asking about?\n\n" + "\n".join(rows)
    )
    a = para(
        "Almost everything is comfortably inside its reference range — kidney and liver markers, "
        "thyroid, blood sugar and cholesterol all look unremarkable.",
        "The one flagged value is near the end of the report, and the lab itself suggests a "
        f"supplement and a repeat test. That's worth a short conversation with Dr. {doc}: ask "
        "about the likely cause, the dose, and when to recheck.",
    )
    return Fact(
        turns=[(q, a)],
        target=[0],
        long=True,
        deep="Ferritin",
        queries={
            "keyword": ["ferritin below reference oral iron", "ferritin result"],
            "paraphrase": [
                "did my checkup reveal I'm lacking a trace element?",
                "which nutrient deficiency turned up in my routine checkup?",
            ],
            "mixed": [f"what should I bring up with Dr. {doc} from my annual bloods?"],
        },
    )


@template("speech_long", "family", long=True)
def t_speech(c: Ctx) -> Fact:
    par = c.p["parent"]
    lake = c.pick(
        ["Lake Tahoe", "Loch Lomond", "Lac d'Annecy", "Lake Taupō", "Moraine Lake", "Lake Bled"]
    )
    age = c.pick(["70th", "65th", "75th", "60th"])
    sentences = [
        "When I think about growing up, the first thing I remember is the kitchen table, always "
        "covered in newspapers, homework and half-finished crosswords.",
        "You taught us that being on time meant being ten minutes early, and we have all "
        "resented and then quietly adopted that rule.",
        "There was the year of the disastrous haircut, which we agreed never to mention again, "
        "and which I am now mentioning in front of everyone.",
        "You never missed a school concert, even the ones where I played the recorder badly for "
        "forty minutes.",
        "Every Sunday there was a roast, and every Sunday someone argued about the gravy.",
        "You worked long hours and still found time to fix every bicycle on the street.",
        "You showed us that kindness is mostly about noticing, and then doing something small.",
        "When I moved away for university, you wrote me a letter every single week, and I still "
        "have all of them in a shoebox.",
        "The garden was your pride: the tomatoes, the runner beans, and the roses that the "
        "neighbours' cat loved to sleep under.",
        "You taught all of us to swim, to ride, to drive, and, with mixed success, to cook.",
        "We did not always agree, but we always knew where we stood, and that is a gift.",
        "Your laugh could fill a room, and usually did, at the worst possible moment.",
        "You read to us every night, doing every voice, even when you were exhausted.",
        "Grandchildren arrived and somehow you had even more patience for them than for us.",
    ]
    paras: list[str] = [f"Speech for {c.p['parent']}'s {age} — draft", ""]
    while sum(len(x) + 1 for x in paras) < 4500:
        paras.append(" ".join(c.rng.sample(sentences, c.rng.randint(3, 5))))
    paras.append(
        f"And of course there was the summer we drove to {lake} in the orange camper van, and "
        "the engine caught fire ten miles short, and you made us sing while we waited for the "
        "tow truck, and somehow that became the best holiday we ever had."
    )
    paras.extend(" ".join(c.rng.sample(sentences, 3)) for _ in range(c.rng.randint(1, 3)))
    paras.append(f"So please raise your glasses: to my {par}, happy birthday.")
    q = (
        f"I'm giving a speech at my {par}'s {age} birthday dinner. It's too long — can you "
        "suggest what to cut without losing the heart of it?\n\n" + "\n\n".join(paras)
    )
    a = para(
        "It's warm and funny, and the length is the only real problem: aim for three to four "
        "minutes.",
        "Keep the opening image, one story that makes people laugh and one that makes them "
        "misty, and the toast. Cut repeated points — the lists of things they taught you can "
        "become one sentence.",
        "The road-trip story near the end is your strongest material; consider moving it "
        "earlier so it doesn't get lost.",
    )
    return Fact(
        turns=[(q, a)],
        target=[0],
        long=True,
        deep="orange camper van",
        queries={
            "keyword": [f"orange camper van {lake}", "camper van engine caught fire"],
            "paraphrase": [
                "the family anecdote where our vehicle burst into flames during a vacation"
            ],
            "mixed": [f"which anecdote from {lake} is in the toast?"],
        },
    )


# ----------------------------------------------------------------------------- fillers
# Turns no question points at: ordinary chat on the same topics, with the persona's names,
# and a few unqueried ids (some near-duplicates of the planted ones).

FILLERS: dict[str, list[tuple[str, str]]] = {
    "finance": [
        (
            "What's the actual difference between a Roth IRA and a traditional IRA? Keep it short.",
            "Traditional: you may deduct contributions now and pay income tax on withdrawals in "
            "retirement. Roth: you contribute after-tax money and qualified withdrawals are tax-free. "
            "If you expect a higher tax rate later, Roth tends to win; if lower, traditional. Many "
            "people split contributions to hedge.",
        ),
        (
            "{partner} and I are thinking about a joint account for shared bills. Pros and cons?",
            "Pros: one place for rent, utilities and groceries, less back-and-forth. Cons: less "
            "privacy, and both of you are liable for any overdraft. A common setup is a joint account "
            "fed by equal or proportional transfers, with personal accounts kept separate for "
            "everything else.",
        ),
        (
            "Explain compound interest with a concrete example, like {cur}10,000 over 20 years.",
            "At 5% a year compounded annually, {cur}10,000 becomes about {cur}26,500 after 20 years: "
            "each year's interest earns interest the following year. At 7% it's about {cur}38,700 — "
            "the difference between rates grows dramatically over long periods.",
        ),
        (
            "Should I pay off my car loan early? It's at 6.9% with 30 months left.",
            "Paying off a 6.9% loan is a guaranteed 6.9% return, which is hard to beat safely. Check "
            "for prepayment penalties first, and keep your emergency fund intact — don't empty "
            "savings to do it.",
        ),
        (
            "I got a text saying my {bank} account is locked and to click a link to verify. Real?",
            "Almost certainly phishing. Banks don't ask you to verify through links in texts. Don't "
            "click; open the banking app or call the number on your card. Forward the text to your "
            "carrier's spam number and delete it.",
        ),
        (
            "Set up a monthly transfer of {cur}50 to {kid}'s junior savings, {near_acct}. Which day "
            "of the month is best?",
            "The day after payday is best, so the transfer never competes with bills. Name the "
            "transfer '{kid} savings' so it's easy to spot on statements, and review the amount each "
            "birthday.",
        ),
        (
            "How do I read my credit report? What should I look for?",
            "Check personal details first, then each account: balances, payment history and any "
            "late marks. Look for accounts you don't recognise and hard inquiries you didn't "
            "authorise. Dispute errors with the bureau directly; it's free.",
        ),
        (
            "Dinner bill is {cur}{bill} for five people, we want to tip 18%. How much each?",
            "Add 18% and divide by five: each person pays about {cur}{each}. If someone only had a "
            "starter, it's kinder to settle by item.",
        ),
    ],
    "work": [
        (
            "Write me an out-of-office reply for next week, friendly but brief.",
            "Thanks for your message! I'm out of the office until Monday with limited access to "
            "email. For anything urgent, please contact {colleague}. Otherwise I'll reply when I'm "
            "back.",
        ),
        (
            "Rewrite this so it sounds less defensive: 'As I already said, the delay was not my "
            "fault, the API was down.' It's for {manager}.",
            "Try: 'Quick update on the delay: the upstream API was unavailable for most of Tuesday, "
            "which blocked the integration work. It's back now and I expect to finish by Thursday. "
            "Happy to talk through options if that date is a problem.'",
        ),
        (
            "Give me a retro format that isn't start/stop/continue.",
            "Try 'sailboat': wind (what pushed us forward), anchors (what held us back), rocks "
            "(risks ahead) and island (the goal). Ten minutes of silent sticky notes, then group and "
            "vote on one anchor to fix next sprint.",
        ),
        (
            "{colleague} keeps interrupting me in meetings. How do I handle it without drama?",
            "In the moment: 'I'd like to finish this thought, then I'm keen to hear yours.' Said "
            "calmly, it works. If it keeps happening, a private chat framed around the team ('I've "
            "noticed we talk over each other') usually lands better than an accusation.",
        ),
        (
            "Draft an agenda for my 1:1 with {manager} this week.",
            "1. Wins since last time (2 min). 2. Blockers and where I need help. 3. Priorities for "
            "the next two weeks — confirm the order. 4. Growth: one thing I'm working on. 5. "
            "Anything from your side.",
        ),
        (
            "How do I say no to an extra project without sounding lazy?",
            "Make it about trade-offs: 'I can take this on if we move X to next month — which "
            "matters more right now?' That puts the choice where it belongs and shows you're "
            "thinking about outcomes.",
        ),
        (
            "Can {near_inc} be closed? It was the same outage everyone had last week, resolved now.",
            "Yes — add a closing note that it was resolved with the wider incident and link the "
            "parent ticket, then ask the service desk to close it as a duplicate so the metrics "
            "stay clean.",
        ),
        (
            "Help me write a job ad for a junior data analyst at {employer}.",
            "Lead with the work, not the company: what they'll analyse, who they'll work with, and "
            "what they'll learn. Keep requirements to five real must-haves (SQL, one scripting "
            "language, clear writing), list the salary range, and say how the interview works.",
        ),
    ],
    "software": [
        (
            "Explain the Python GIL in two paragraphs.",
            "The Global Interpreter Lock lets only one thread execute Python bytecode at a time in "
            "CPython. It keeps memory management simple but means CPU-bound threads don't run in "
            "parallel.\n\nI/O-bound threads still benefit, since the lock is released while waiting. "
            "For CPU-bound work use multiprocessing, native extensions that release the lock, or "
            "the free-threaded builds in newer versions.",
        ),
        (
            "git merge vs rebase — when should I use which?",
            "Rebase your own feature branch onto main to keep history linear before opening a pull "
            "request. Merge (or squash-merge) into shared branches. Never rebase commits other "
            "people have already pulled.",
        ),
        (
            "One-liner to find the 20 largest files under the current directory?",
            "find . -type f -printf '%s %p\\n' | sort -nr | head -20 — or with human-readable sizes: "
            "du -ah . | sort -rh | head -20.",
        ),
        (
            "What kinds of indexes does Postgres have and when do I use each?",
            "B-tree for equality and ranges (the default), Hash for equality only, GIN for arrays, "
            "JSONB and full-text search, GiST for geometric and range types, BRIN for huge tables "
            "naturally ordered by a column such as time. Partial and expression indexes narrow any "
            "of these.",
        ),
        (
            "What's the difference between HTTP 401 and 403?",
            "401 means 'I don't know who you are' — authentication missing or invalid. 403 means "
            "'I know who you are, and you're not allowed' — authorization failed.",
        ),
        (
            "Show me a docker compose healthcheck for a Postgres service.",
            "healthcheck: test: ['CMD-SHELL', 'pg_isready -U postgres'], interval: 5s, timeout: 3s, "
            "retries: 10 — and in the app service use depends_on with condition: service_healthy.",
        ),
        (
            "Dataclasses or pydantic for config objects?",
            "Dataclasses if the values are already trusted and typed; pydantic when they come from "
            "outside (env vars, files, requests) and need parsing and validation. Mixing is fine: "
            "validate at the edge, pass dataclasses inside.",
        ),
        (
            "My Java service has two threads stuck forever, each holding a lock the other needs. "
            "How do I find where?",
            "Take a thread dump (jstack <pid> or kill -3) — the JVM reports 'Found one Java-level "
            "deadlock' with both stacks. The fix is the same as anywhere: acquire locks in one "
            "global order, or use tryLock with a timeout.",
        ),
    ],
    "health": [
        (
            "Is 10,000 steps a day actually a real target?",
            "It started as a marketing number, but studies find benefits rising up to about "
            "7,000–9,000 steps for most adults, with diminishing returns after. Any increase from "
            "your current baseline helps.",
        ),
        (
            "Give me a five-minute stretching routine for desk days.",
            "Neck tilts (30 s each side), shoulder rolls (30 s), chest opener in a doorway (1 min), "
            "seated spinal twist (30 s each side), hip flexor stretch (30 s each side), calf raises "
            "(30 s). Do it mid-morning and mid-afternoon.",
        ),
        (
            "Is intermittent fasting worth trying?",
            "It works for some people mainly because it makes eating less easier. Results are "
            "similar to other calorie-controlled approaches. It's not a good fit with diabetes "
            "medication or a history of disordered eating — check with a doctor first.",
        ),
        (
            "A friend coming to our party is allergic to shellfish. What should I serve?",
            "Keep the whole menu shellfish-free rather than a separate plate: cross-contact is the "
            "real risk. Grilled chicken skewers, a big salad, roasted vegetables and flatbreads are "
            "safe crowd-pleasers. Label anything from a shop and ask your friend what they're "
            "comfortable with.",
        ),
        (
            "How do I choose running shoes? Everyone says something different.",
            "Comfort is the best predictor: try several pairs late in the day, run a few steps in "
            "the shop, and pick what feels good immediately. Leave a thumb's width at the toe.",
        ),
        (
            "{partner} snores and I'm exhausted. Any fixes that actually work?",
            "Side-sleeping, no alcohol close to bedtime and treating nasal congestion help many "
            "people. Loud snoring with pauses or gasps can be sleep apnoea and is worth a doctor's "
            "visit. Meanwhile, good earplugs are a relationship saver.",
        ),
        (
            "Is it normal to be sore two days after lifting weights?",
            "Yes, that's delayed-onset muscle soreness and it peaks 24–72 hours after a new or harder "
            "session. Light movement helps; sharp pain or swelling doesn't fit and deserves a check.",
        ),
        (
            "Recommend a meditation approach for someone who hates meditation.",
            "Try box breathing: in for four, hold four, out four, hold four, for two minutes. No "
            "app, no chanting. Attach it to something you already do, like waiting for the kettle.",
        ),
    ],
    "travel": [
        (
            "Packing list for a long weekend in {other_city} in autumn?",
            "Layers: two tops, a warm jumper, a waterproof jacket, comfortable walking shoes, one "
            "nicer outfit, an umbrella, adaptor, chargers and a small day bag. Leave space for "
            "anything you buy.",
        ),
        (
            "How do I beat jet lag flying east?",
            "Shift your sleep an hour earlier for a few days before, get morning light at the "
            "destination, avoid long naps on arrival day, and eat meals on local time.",
        ),
        (
            "When's the best time of year to visit {other_city}?",
            "Late spring and early autumn usually balance weather, prices and crowds. Check local "
            "holidays — some cities empty out, others get packed.",
        ),
        (
            "What should I look for in travel insurance?",
            "Medical cover (including evacuation), cancellation for reasons that matter to you, "
            "baggage limits that match what you carry, and the excess. Read the exclusions for "
            "pre-existing conditions and adventure activities.",
        ),
        (
            "How early should I get to the airport for an international departure?",
            "Three hours for long-haul at busy airports, two to two and a half for short-haul. Add "
            "time if you're checking bags at peak times.",
        ),
        (
            "{kid} gets carsick on long drives. What helps?",
            "Front-facing seat with a view out of the window, fresh air, no screens or books, light "
            "snacks rather than a big meal, and regular stops. Ask a pharmacist about age-appropriate "
            "remedies.",
        ),
        (
            "Train from {other_city} to the coast is booked, reference {rnd_ref}. Do I need to "
            "print anything?",
            "Usually not: the e-ticket on your phone is enough, but screenshot it in case you lose "
            "signal, and carry the card you paid with.",
        ),
    ],
    "cooking": [
        (
            "How long do I boil eggs for jammy yolks?",
            "Lower fridge-cold eggs into boiling water for 6.5 minutes, then straight into ice "
            "water for two minutes. Seven minutes if they're large or you like them firmer.",
        ),
        (
            "Quick weeknight pasta with what's usually in the cupboard?",
            "Pasta puttanesca: garlic, anchovies, chilli, tinned tomatoes, olives and capers, "
            "simmered while the pasta cooks. Twenty minutes, very forgiving.",
        ),
        (
            "How do I sharpen a kitchen knife with a whetstone?",
            "Soak the stone, hold the blade at about 15–20 degrees, and push edge-first along the "
            "stone in smooth strokes, ten per side, then finish on the fine side. Hone before each "
            "use to keep it sharp longer.",
        ),
        (
            "Substitute for buttermilk?",
            "Stir a tablespoon of lemon juice or white vinegar into a cup of milk and wait five "
            "minutes. Thinned plain yoghurt works too.",
        ),
        (
            "How do I keep fresh herbs from wilting in two days?",
            "Soft herbs like basil and parsley: trim the stems and stand them in a glass of water, "
            "basil on the counter, parsley in the fridge with a bag over it. Woody herbs: wrap in a "
            "damp paper towel in the fridge.",
        ),
        (
            "Lunchbox ideas for {kid}? School is nut-free.",
            "Wraps with hummus and grated carrot, pasta salad, cheese and crackers, cucumber sticks, "
            "fruit, and homemade oat muffins made with seeds instead of nuts. Rotate so nothing gets "
            "boring.",
        ),
        (
            "What wine goes with mushroom risotto?",
            "An earthy red like Pinot Noir, or a rich white such as an oaked Chardonnay. Use a "
            "glass of the white in the risotto itself.",
        ),
        (
            "How do I meal prep lunches for the week without getting bored?",
            "Cook components, not meals: one grain, two proteins, three roasted vegetables and two "
            "sauces. Mix differently each day.",
        ),
    ],
    "shopping": [
        (
            "Robot vacuum: is lidar worth it over a camera-based one?",
            "Lidar navigates reliably in the dark and maps faster; camera models are cheaper and "
            "fine in bright homes. If you have pets, prioritise a good brush design and app "
            "no-go zones over navigation tech.",
        ),
        (
            "How do I spot fake product reviews?",
            "Watch for many five-star reviews posted in a short window, vague praise without "
            "details, and reviewers with one review. Sort by most recent and read the three-star "
            "ones — they tend to be honest.",
        ),
        (
            "{kid} needs a winter coat. What matters most?",
            "Warmth without bulk so they can move, a hood, a long enough back, and cuffs that seal. "
            "Buy one size up only if the sleeves can be turned back.",
        ),
        (
            "Can I return something without a receipt?",
            "Often yes, for store credit at the lowest recent price, with ID. A bank statement "
            "showing the purchase can count as proof for a refund.",
        ),
        (
            "Order {rnd_order} arrived with a cracked screen protector. Worth complaining?",
            "Yes — photograph it, including the packaging, and ask for a replacement through the "
            "order page. Retailers usually send one without needing the damaged item back.",
        ),
        (
            "Best budget noise-cancelling headphones for a commute?",
            "Look for active noise cancelling, at least 20 hours of battery, a comfortable fit and a "
            "transparency mode. Mid-range models from established audio brands are usually the best "
            "value.",
        ),
    ],
    "family": [
        (
            "Rainy day ideas for a seven-year-old and a four-year-old?",
            "Blanket fort with torches, a kitchen 'science lab' (baking soda volcanoes), a treasure "
            "hunt with picture clues for the younger one, and a living-room obstacle course.",
        ),
        (
            "How do I talk to {kid} about screen time without a fight?",
            "Agree the rules together at a calm moment, not in the middle of a game. Explain why, "
            "offer choices within limits, and stick to the agreement consistently.",
        ),
        (
            "{kid2} won't sleep in their own bed any more. Help?",
            "Keep the same bedtime routine, sit by the bed and move your chair a little further "
            "away every few nights, and praise the mornings they stayed. Consistency beats "
            "everything else here.",
        ),
        (
            "Invitation wording for {kid2}'s birthday at a trampoline park?",
            "You're invited to bounce with {kid2}! Join us at the trampoline park on Saturday from "
            "2 to 4pm for jumping, pizza and cake. Please wear grip socks (or buy them there). RSVP "
            "by Wednesday.",
        ),
        (
            "{pet} keeps chewing the furniture when we're out. What can we do?",
            "More exercise before you leave, a stuffed chew toy given only at departure, and a "
            "smaller safe space while you're out. If it's panic rather than boredom, talk to the "
            "vet about separation anxiety.",
        ),
        (
            "Gift ideas for my {parent}'s retirement?",
            "Something that marks the next chapter: a class they've always wanted to take, a photo "
            "book of their career, or a trip together. Experiences usually beat objects at this "
            "stage.",
        ),
        (
            "Chore chart ideas for kids aged {age} and up?",
            "Two or three age-appropriate jobs each (feeding {pet}, setting the table, tidying "
            "toys), pictures instead of words for younger ones, and a small weekly reward rather "
            "than per-task pay.",
        ),
    ],
}


def fresh_near(c: Ctx, base: str) -> str:
    taken = c.state.setdefault("ids", set())
    while True:
        out = near_digits(c.rng, base)
        if out not in taken:  # type: ignore[operator]
            return out


def fill_filler(c: Ctx, q: str, a: str) -> tuple[str, str]:
    acct = str(c.state.get("acct") or f"acct-{digits(c.rng, 4)}")
    inc = str(c.state.get("inc") or f"INC-{digits(c.rng, 5)}")
    bill = c.rng.randrange(120, 400)
    slots = dict(c.p)
    slots.update(
        bank=str(c.state.get("bank") or c.pick(BANKS)),
        near_acct=fresh_near(c, acct),
        near_inc=fresh_near(c, inc),
        other_city=c.pick(["Porto", "Bruges", "Seville", "Kraków", "Valletta", "Ljubljana"]),
        rnd_ref=upper_alnum(c.rng, 6),
        rnd_order=f"ORD-{digits(c.rng, 7)}",
        bill=bill,
        each=f"{bill * 1.18 / 5:.2f}",
        age=c.rng.randint(4, 9),
    )
    return q.format(**slots), a.format(**slots)


# ----------------------------------------------------------------------------- assembly

CATEGORY_P = {"paraphrase": 0.8, "exact_id": 0.95, "keyword": 0.6, "mixed": 0.55}
CATEGORIES = ("exact_id", "keyword", "paraphrase", "mixed")
START = datetime(2024, 3, 1, tzinfo=UTC)
END = datetime(2025, 5, 31, tzinfo=UTC)


@dataclass
class Turn:
    conversation_id: str
    turn_id: str
    turn_time: datetime
    question: str
    answer: str
    topic: str

    @property
    def text(self) -> str:
        return self.question + "\n" + self.answer


# The templates that plant the ids of SHARED_IDS, always chosen where an id is shared.
SHARED_ID_TEMPLATES = {"acct": "rent_debit", "inc": "it_ticket"}


def choose_templates(rng: random.Random, key: str) -> list[Template]:
    longs = [t for t in TEMPLATES.values() if t.long]
    short = [t for t in TEMPLATES.values() if not t.long]
    chosen = {t.name for t in rng.sample(longs, rng.choice([1, 2, 2]))}
    chosen |= {SHARED_ID_TEMPLATES[k] for k, v in SHARED_IDS.items() if key in v}
    pool = [t.name for t in short]
    rng.shuffle(pool)
    for name in pool:
        if len(chosen) >= FACTS_PER_PRINCIPAL:
            break
        chosen.add(name)
        need = TEMPLATES[name].needs
        if need:
            chosen.add(need)
    # Dependencies first, otherwise random order.
    order = sorted(sorted(chosen), key=lambda n: (TEMPLATES[n].needs is not None, rng.random()))
    return [TEMPLATES[n] for n in order]


def new_conversation_id(rng: random.Random, taken: set[str]) -> str:
    while True:
        cid = "c-" + "".join(rng.choice("0123456789abcdef") for _ in range(10))
        if cid not in taken:
            taken.add(cid)
            return cid


def id_pattern(ident: str) -> re.Pattern[str]:
    return re.compile(r"(?<![A-Za-z0-9-])" + re.escape(ident) + r"(?![A-Za-z0-9]|-[A-Za-z0-9])")


@dataclass
class Built:
    principal: dict[str, object]
    turns: list[Turn]
    questions: list[dict[str, object]]
    dropped: Counter[str]


def build_principal(index: int, persona: dict[str, str], taken_cids: set[str]) -> Built:
    rng = random.Random(f"{SEED}:{index}")
    state: dict[str, object] = {"ids": set()}
    templates = choose_templates(rng, f"{persona['tenant']}/{persona['principal']}")

    # Plan conversations: one per fact, sometimes a dependent fact joins its dependency's.
    convs: list[dict[str, object]] = []
    home: dict[str, dict[str, object]] = {}
    for t in templates:
        if t.needs and t.needs in home and rng.random() < 0.5:
            home[t.needs]["facts"].append(t)  # type: ignore[attr-defined]
            home[t.name] = home[t.needs]
            continue
        conv = {"topic": t.topic, "facts": [t]}
        convs.append(conv)
        home[t.name] = conv
    # Filler-only conversations.
    n_filler_convs = rng.randint(6, 9)
    topics = list(FILLERS)
    for _ in range(n_filler_convs):
        convs.append({"topic": rng.choice(topics), "facts": []})
    # Times: sorted random starts; conversation order keeps dependencies first.
    starts = sorted(
        START + timedelta(seconds=rng.randrange(int((END - START).total_seconds()))) for _ in convs
    )
    for conv, st in zip(convs, starts, strict=True):
        conv["start"] = st.replace(microsecond=0)

    # Fillers available per topic, each used at most once by this principal.
    filler_pool = {k: rng.sample(v, len(v)) for k, v in FILLERS.items()}
    fillers_left = FILLERS_PER_PRINCIPAL

    def take_filler(topic: str) -> tuple[str, str] | None:
        nonlocal fillers_left
        if fillers_left <= 0:
            return None
        pool = (
            filler_pool[topic]
            or filler_pool[rng.choice([k for k in filler_pool if filler_pool[k]] or [topic])]
        )
        if not pool:
            return None
        fillers_left -= 1
        return pool.pop()

    turns: list[Turn] = []
    facts: list[tuple[Template, Fact, list[Turn]]] = []
    # Instantiate facts in the planned (dependency-first) order, each at its conversation's time.
    for conv in convs:
        conv["items"] = []
    for t in templates:
        conv = home[t.name]
        ctx = Ctx(rng, persona, conv["start"], state)  # type: ignore[arg-type]
        fact = t.make(ctx)
        state["ids"].update(fact.ids)  # type: ignore[attr-defined]
        conv["items"].append(("fact", t, fact))  # type: ignore[attr-defined]

    for conv in convs:
        cid = new_conversation_id(rng, taken_cids)
        topic = str(conv["topic"])
        ctx = Ctx(rng, persona, conv["start"], state)  # type: ignore[arg-type]
        seq: list[tuple[str, object, object]] = list(conv["items"])  # type: ignore[arg-type]
        n_fill = rng.randint(0, 3) if seq else rng.randint(1, 4)
        for _ in range(n_fill):
            f = take_filler(topic)
            if f is not None:
                seq.insert(rng.randint(0, len(seq)), ("filler", None, fill_filler(ctx, *f)))
        clock = conv["start"]
        made: list[Turn] = []
        for kind, t, payload in seq:
            clock = clock + timedelta(seconds=rng.randint(40, 600))  # type: ignore[operator]
            if kind == "filler":
                q, a = payload  # type: ignore[misc]
                made.append(Turn(cid, f"t{len(made) + 1:02d}", clock, q, a, topic))  # type: ignore[arg-type]
                continue
            fact: Fact = payload  # type: ignore[assignment]
            own: list[Turn] = []
            for q, a in fact.turns:
                tt = Turn(cid, f"t{len(made) + 1:02d}", clock, q, a, t.topic)  # type: ignore[union-attr, arg-type]
                made.append(tt)
                own.append(tt)
            # Sometimes a follow-up that repeats the fact's id (so an id has two relevant turns).
            if fact.ids and rng.random() < 0.25:
                ident = fact.ids[0]
                clock = clock + timedelta(seconds=rng.randint(40, 300))  # type: ignore[operator]
                fq = rng.choice(
                    [
                        "Thanks. Can you give me that as a two-line note for my records?",
                        "Perfect. Summarise it in one line I can paste into my notes app.",
                        "Great, and can you remind me of this next week?",
                    ]
                )
                fa = rng.choice(
                    [
                        f"Note: {ident} — follow up in a week if nothing has changed.",
                        f"Sure — reminder set for next week about {ident}.",
                        f"{ident}: open item; check status next week and escalate if needed.",
                    ]
                )
                made.append(Turn(cid, f"t{len(made) + 1:02d}", clock, fq, fa, t.topic))  # type: ignore[union-attr, arg-type]
            facts.append((t, fact, own))  # type: ignore[arg-type]
        turns.extend(made)

    # Long turns must have their fact past the first chunk (chunks are at most 4,000 chars).
    for t, fact, own in facts:
        if fact.long:
            at = own[0].text.find(fact.deep)
            assert fact.deep and at > 4000, (t.name, at)
            assert own[0].text.count(fact.deep) == 1, t.name

    questions, dropped = make_questions(rng, persona, turns, facts)
    principal = {
        "tenant_id": persona["tenant"],
        "principal_id": persona["principal"],
        "persona": f"{persona['name']}, {persona['role']} at {persona['employer']}, "
        f"lives in {persona['city']}",
    }
    return Built(principal, turns, questions, dropped)


def make_questions(
    rng: random.Random,
    persona: dict[str, str],
    turns: list[Turn],
    facts: list[tuple[Template, Fact, list[Turn]]],
) -> tuple[list[dict[str, object]], Counter[str]]:
    all_ids = {i for _, f, _ in facts for i in f.ids}
    turn_content = [{norm(w) for w in content(t.text)} for t in turns]
    dropped: Counter[str] = Counter()
    out: list[dict[str, object]] = []

    def df(word: str) -> int:
        n = norm(word)
        return sum(1 for tc in turn_content if n in tc)

    def has_id(query: str) -> bool:
        return any(id_pattern(i).search(query) for i in all_ids)

    for t, fact, own in facts:
        target_text = "\n".join(x.text for x in own)
        wanted = [
            cat for cat in CATEGORIES if cat in fact.queries and rng.random() < CATEGORY_P[cat]
        ]
        if not wanted:
            wanted = ["paraphrase"]
        for cat in wanted:
            variants = fact.queries[cat][:]
            rng.shuffle(variants)
            chosen: tuple[str, list[Turn]] | None = None
            for qtext in variants:
                if cat == "exact_id":
                    idents = [i for i in fact.ids if id_pattern(i).search(qtext)]
                    if not idents:
                        continue
                    pat = id_pattern(idents[0])
                    rel = [x for x in turns if pat.search(x.text)]
                    if not all(o in rel for o in own):
                        continue
                    chosen = (qtext, rel)
                    break
                if has_id(qtext):
                    continue
                shared = shared_words(qtext, target_text)
                if cat == "paraphrase" and not shared:
                    chosen = (qtext, own)
                    break
                if cat == "keyword" and shared and min(df(w) for w in shared) <= 3:
                    chosen = (qtext, own)
                    break
                if cat == "mixed" and shared and (content(qtext) - shared):
                    chosen = (qtext, own)
                    break
            if chosen is None:
                dropped[f"{t.name}/{cat}"] += 1
                continue
            qtext, rel = chosen
            out.append(
                {
                    "tenant_id": persona["tenant"],
                    "principal_id": persona["principal"],
                    "query": qtext,
                    "category": cat,
                    "topic": t.topic,
                    "fact": t.name,
                    "relevant": [
                        {"conversation_id": x.conversation_id, "turn_id": x.turn_id} for x in rel
                    ],
                }
            )
    return out, dropped


def build() -> tuple[dict[str, object], Counter[str]]:
    taken: set[str] = set()
    principals: list[dict[str, object]] = []
    turns: list[dict[str, object]] = []
    questions: list[dict[str, object]] = []
    dropped: Counter[str] = Counter()
    for i, persona in enumerate(PERSONAS):
        b = build_principal(i, persona, taken)
        principals.append(b.principal)
        for t in b.turns:
            turns.append(
                {
                    "tenant_id": persona["tenant"],
                    "principal_id": persona["principal"],
                    "conversation_id": t.conversation_id,
                    "turn_id": t.turn_id,
                    "turn_time": t.turn_time.strftime("%Y-%m-%dT%H:%M:%SZ"),
                    "topic": t.topic,
                    "question": t.question,
                    "answer": t.answer,
                }
            )
        questions.extend(b.questions)
        dropped.update(b.dropped)
    for n, q in enumerate(questions, 1):
        q["id"] = f"q{n:04d}"
    questions = [{"id": q.pop("id"), **q} for q in questions]
    data = {
        "schema_version": SCHEMA_VERSION,
        "generator": "bench/eval/make_dataset.py",
        "seed": SEED,
        "principals": principals,
        "turns": turns,
        "questions": questions,
    }
    return data, dropped


def dump(data: dict[str, object]) -> str:
    return json.dumps(data, ensure_ascii=False, indent=1) + "\n"


def stats(data: dict[str, object], dropped: Counter[str]) -> str:
    turns: list[dict[str, str]] = data["turns"]  # type: ignore[assignment]
    qs: list[dict[str, object]] = data["questions"]  # type: ignore[assignment]
    lines = []
    lengths = [len(t["question"]) + 1 + len(t["answer"]) for t in turns]
    convs = {(t["tenant_id"], t["principal_id"], t["conversation_id"]) for t in turns}
    lines.append(
        f"principals {len(data['principals'])}  conversations {len(convs)}  "  # type: ignore[arg-type]
        f"turns {len(turns)}  questions {len(qs)}"
    )
    lines.append(
        f"turn chars: median {sorted(lengths)[len(lengths) // 2]}, max {max(lengths)}, "
        f"over 4000: {sum(n > 4000 for n in lengths)}, total {sum(lengths):,}"
    )
    per_p = Counter((t["tenant_id"], t["principal_id"]) for t in turns)
    per_pq = Counter((q["tenant_id"], q["principal_id"]) for q in qs)
    for k in per_p:
        lines.append(f"  {k[0]}/{k[1]}: {per_p[k]} turns, {per_pq[k]} questions")
    lines.append(
        "categories: "
        + ", ".join(f"{c} {n}" for c, n in sorted(Counter(q["category"] for q in qs).items()))
    )  # type: ignore[misc]
    lines.append(
        "topics: "
        + ", ".join(f"{c} {n}" for c, n in sorted(Counter(q["topic"] for q in qs).items()))
    )  # type: ignore[misc]
    multi = sum(len(q["relevant"]) > 1 for q in qs)  # type: ignore[arg-type]
    lines.append(f"questions with more than one relevant turn: {multi}")
    if dropped:
        lines.append(
            f"dropped (no variant met its category rule): {sum(dropped.values())}: "
            + ", ".join(f"{k} {v}" for k, v in sorted(dropped.items()))
        )
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--check", action="store_true", help="fail if the file on disk differs")
    ap.add_argument("--samples", type=int, default=0, help="print N random questions")
    args = ap.parse_args()
    data, dropped = build()
    text = dump(data)
    print(stats(data, dropped))
    if args.samples:
        turns = {
            (t["tenant_id"], t["principal_id"], t["conversation_id"], t["turn_id"]): t
            for t in data["turns"]
        }  # type: ignore[attr-defined]
        for q in random.Random(args.samples).sample(data["questions"], args.samples):  # type: ignore[arg-type]
            print(
                f"\n[{q['id']} {q['category']} {q['tenant_id']}/{q['principal_id']}] {q['query']}"
            )
            for r in q["relevant"]:
                t = turns[(q["tenant_id"], q["principal_id"], r["conversation_id"], r["turn_id"])]
                body = (t["question"] + " || " + t["answer"]).replace("\n", " ")
                print(
                    f"   -> {r['conversation_id']}/{r['turn_id']}: {body[:300]}"
                    + (f" ...[{len(body)} chars]" if len(body) > 300 else "")
                )
    if args.check:
        if not args.out.exists() or args.out.read_text(encoding="utf-8") != text:
            print(f"{args.out} is not what the generator produces; rerun it", file=sys.stderr)
            return 1
        print(f"{args.out} is up to date")
        return 0
    args.out.write_text(text, encoding="utf-8")
    print(f"wrote {args.out} ({len(text.encode()):,} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
