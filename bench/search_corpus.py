"""A deterministic synthetic corpus of assistant conversations, for the search benchmarks.

Why synthetic: a benchmark at 100,000 chunks needs far more text than any labelled set in the
repository, and it must be the same on every run and machine (no download, no model). The text
is built from sentence templates on eight everyday topics (travel, software incidents, money,
health, cooking, home, work, study), filled from pools of names, places, products, amounts,
dates and ids. It is English prose with the features that matter to the two retrieval sides:
stop words, inflected words for the stemmer, rare tokens such as `acct-4821` or `INC-20931`
that keyword search must find, and long answers that are split into several chunks.

Each principal has a persona: a few people, places, projects and ids that it keeps coming back
to (70% of the slots are filled from it), so its conversations repeat distinctive terms, as a
real user's do. Turns belong to conversations of 1-12 turns on one topic. Lengths: questions
40-230 characters; answers 2-120 sentences, log-normal with a median of 14. Measured on the
100,000-chunk corpus of bench_search.py (`describe`): turn text p50 about 1,160 characters,
p90 about 3,450, longest about 11,200; 1.09 chunks per turn, 7% of turns split into two or
three chunks.

`queries` makes real search queries for a principal from its own turns: ids it mentions, a few
consecutive content words of one of its sentences, and natural questions about its persona's
entities, in the proportions a memory-assisted chat would plausibly produce.
"""

from __future__ import annotations

import functools
import math
import random
import string
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from server.domain.chunking import split_turn
from server.domain.keywords import KeywordEncoder, keyword_document
from server.domain.model import SparseVector

# --------------------------------------------------------------------------------------------
# Pools: values a slot can take. A persona draws its own subset of each.
# --------------------------------------------------------------------------------------------


def _words(text: str) -> tuple[str, ...]:
    return tuple(text.split())


_FIRST = _words(
    "Ana José Mei Tomasz Zoë Kwame Priya Lars Fatima Diego Ingrid Omar Sakura Liam Chioma "
    "Mateo Aisha Henrik Lucía Ravi Noor Emeka Yuki Björn Camila Dmitri Leila Arjun Sofía "
    "Tariq Elena Kofi Hana Pedro Amara Viktor Isla Javier Mariam Oskar"
)
_CITIES = _words(
    "Porto Lisbon Zürich Kraków Osaka Nairobi Málaga Leeds Denver Montréal Oaxaca Tbilisi "
    "Hanoi Tallinn Valparaíso Kyoto Accra Bergen Seville Ljubljana Medellín Edinburgh Busan "
    "Marrakesh Gdańsk Cork Brisbane Halifax Cusco Trieste"
)
_COMPANIES = _words(
    "Northwind Contoso Initech Globex Umbrella Hooli Vandelay Stark Wayne Tyrell Soylent "
    "Cyberdyne Aperture Gringotts Monarch Oscorp Pied-Piper Dunder-Mifflin"
)
_PROJECTS = _words(
    "Atlas Borealis Cobalt Driftwood Ember Fjord Granite Helios Ironbark Juniper Kestrel "
    "Lumen Meridian Nimbus Obsidian Pelican Quarry Redwood Sextant Tundra"
)
_SERVICES = _words(
    "billing-api checkout ledger auth-gateway search-indexer notification-worker "
    "payments-service inventory-sync report-builder image-resizer session-store"
)
_TOOLS = _words(
    "PostgreSQL Kubernetes Terraform Grafana Prometheus Redis Kafka nginx Airflow dbt "
    "Snowflake Jenkins ArgoCD Vault Sentry Datadog"
)
_LANGS = _words("Python Go Rust TypeScript Kotlin Java Elixir Scala")
_FOODS = _words(
    "ramen bacalhau falafel pierogi dal tacos risotto shakshuka bibimbap goulash paella "
    "moussaka ceviche jollof pho lasagne"
)
_INGREDIENTS = _words(
    "garlic saffron chickpeas miso tahini coriander paprika fennel lemongrass shallots "
    "buttermilk anchovies tamarind cardamom sumac gochujang"
)
_SYMPTOMS = _words(
    "headache insomnia backache heartburn migraine dizziness tendonitis sinusitis eczema fatigue"
)
_MEDS = _words("ibuprofen melatonin omeprazole cetirizine magnesium paracetamol")
_SUBJECTS = (
    "linear algebra",
    "statistics",
    "organic chemistry",
    "macroeconomics",
    "Spanish grammar",
    "music theory",
    "constitutional law",
    "thermodynamics",
)
_ROOMS = _words("kitchen bathroom attic garage balcony hallway bedroom basement")
_MONTHS = _words(
    "January February March April May June July August September October November December"
)
_WEEKDAYS = _words("Monday Tuesday Wednesday Thursday Friday Saturday Sunday")
_AIRLINES = _words("TAP Lufthansa KLM Iberia Finnair Aer-Lingus Qantas Emirates")
_BANKS = _words("Revolut N26 Monzo ING Santander Millennium")

_ID_SHAPES = (
    ("acct", 4),
    ("INC", 5),
    ("PO", 4),
    ("order", 6),
    ("ticket", 5),
    ("PR", 4),
    ("inv", 5),
    ("claim", 6),
)


def _make_id(rng: random.Random) -> str:
    prefix, digits = rng.choice(_ID_SHAPES)
    number = "".join(rng.choice(string.digits) for _ in range(digits))
    suffix = f"-{rng.choice('abcdefgh')}" if rng.random() < 0.2 else ""
    return f"{prefix}-{number}{suffix}"


# --------------------------------------------------------------------------------------------
# Topics: question templates and answer sentence templates.
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Topic:
    """A subject of conversation: what the user asks and what the assistant's answers say."""

    name: str
    questions: tuple[str, ...]
    sentences: tuple[str, ...]
    asks: tuple[str, ...]  # later search queries about this topic


TOPICS: tuple[Topic, ...] = (
    Topic(
        "travel",
        (
            "I'm flying {airline} to {city} on {weekday} {day} {month}; what should I sort "
            "out before I go?",
            "Can you help me plan three days in {city} with {person}? We like {food} and "
            "long walks.",
            "My booking reference is {id} and the flight to {city} was cancelled. What are my "
            "options?",
            "Is it worth renting a car in {city2}, or is public transport good enough?",
            "What's the cheapest way to get from {city} to {city2} in {month}?",
        ),
        (
            "The {airline} flight to {city} leaves at {time}, so plan to be at the airport two "
            "hours earlier.",
            "Keep the booking reference {id} handy; the airline will ask for it at the desk.",
            "In {city} the old town is walkable, and most museums close on {weekday}s.",
            "If the flight is cancelled you are entitled to rebooking or a refund of "
            "{money} under the passenger rights rules.",
            "{person} mentioned that the hotel near the station in {city} charges {money} "
            "per night including breakfast.",
            "Trains between {city} and {city2} run every {num} minutes and take about "
            "{num2} hours.",
            "Book the {food} tasting tour early; in {month} it sells out within days.",
            "Travel insurance claims such as {id} usually need the original receipts and a "
            "letter from the airline.",
            "Renting a car in {city2} costs around {money} a day, plus parking, which is "
            "scarce in the centre.",
            "Pack layers: evenings in {city} in {month} drop to {num} degrees.",
            "Your passport must be valid for at least six months after the return date.",
            "A rail pass would save roughly {money} if you take more than {num} trips.",
        ),
        (
            "when is my flight to {city}",
            "{airline} booking {id}",
            "hotel price in {city}",
            "trains from {city} to {city2}",
            "what did we plan for the trip with {person}",
            "is a car worth it in {city2}",
        ),
    ),
    Topic(
        "incident",
        (
            "The {service} started returning 500s after the {version} deploy; incident "
            "{id} is open. Where do I start?",
            "How do I roll back {service} on {tool} without losing the migrations?",
            "Our {tool} cluster ran out of disk last night. How do we stop that happening again?",
            "Can you write a postmortem outline for {id} about the {service} outage?",
            "Latency on {service} doubled since {weekday}; what should I look at first?",
        ),
        (
            "Incident {id} started at {time} when {service} version {version} reached all pods.",
            "The error rate on {service} rose to {num} percent while the connection pool "
            "to {tool} was exhausted.",
            "{person} rolled back to the previous release and the errors stopped within "
            "{num} minutes.",
            "The root cause was a missing index on the {table} table, which made every "
            "request scan {num2} thousand rows.",
            "Add an alert in {tool2} on p99 latency above {num}00 milliseconds for five minutes.",
            "Run the migration separately from the deploy so a rollback of {service} does "
            "not need to undo the schema.",
            "The retries with exponential backoff hid the failure for about {num} minutes, "
            "which delayed the page.",
            "Follow-up actions are tracked in {id2}; {person} owns the capacity review.",
            "Disk usage on {tool} grew {num} gigabytes a day because old write-ahead logs "
            "were never archived.",
            "Set the pod memory limit of {service} to {num}00 MiB and watch the OOM kills "
            "in {tool2}.",
            "The canary for {version} should have caught this; it only received {num} "
            "percent of traffic for two minutes.",
            "Customer impact: roughly {num2} thousand failed checkouts, refunds handled "
            "under {id2}.",
        ),
        (
            "root cause of {id}",
            "{service} outage postmortem",
            "why did {service} return 500s",
            "rollback {service} {tool}",
            "what alert did we add in {tool2}",
            "disk full on {tool}",
        ),
    ),
    Topic(
        "money",
        (
            "My {bank} account {id} shows a charge of {money} I don't recognise. What should I do?",
            "Help me set a monthly budget: rent is {money}, and I want to save for {thing}.",
            "Should I pay off the car loan early or put {money} into an index fund?",
            "How do I split the {city} holiday costs fairly between me, {person} and {person2}?",
            "When is the tax return due this year, and what do I need for the {thing} deduction?",
        ),
        (
            "Dispute the {money} charge on account {id} within sixty days through the {bank} app.",
            "Your fixed costs come to {money} a month, leaving about {money2} for savings.",
            "Paying the loan early saves {money} in interest, but the emergency fund comes first.",
            "{person} paid for the flat in {city}, so the others owe {money2} each.",
            "Keep the invoice {id2} for the {thing}; it supports the deduction if you are asked.",
            "An index fund with a total expense ratio under 0.2 percent is a sensible default.",
            "The tax return is due on {day} {month}; filing late costs a fixed penalty.",
            "Set up a standing order of {money2} on the {day}th, right after payday.",
            "Your {bank} card was frozen after the suspicious payment; a new one arrives in "
            "{num} days.",
            "Saving {money2} a month gets you to the {thing} goal in about {num} months.",
        ),
        (
            "unknown charge on {bank}",
            "{id} dispute",
            "how much do I save each month",
            "who owes what for {city}",
            "tax deadline {month}",
            "pay off loan or invest",
        ),
    ),
    Topic(
        "health",
        (
            "I've had a {symptom} for {num} days; is {med} okay to take with coffee?",
            "Dr {surname} wants me to track my sleep. What's a simple way to do it?",
            "Can you make me a gentle stretching routine for a {symptom}?",
            "My appointment {id} with Dr {surname} moved to {weekday}; what should I ask?",
        ),
        (
            "{med} is generally fine with coffee, but take it with food to protect the stomach.",
            "If the {symptom} lasts more than {num} days or gets worse, see Dr {surname} again.",
            "Write down bedtime, wake time and how rested you feel, every day for two weeks.",
            "Hold each stretch for thirty seconds and stop if it hurts; do it twice a day.",
            "Bring the list of medicines, including {med}, to the appointment on {weekday}.",
            "Reference {id} is on the letter from the clinic in {city}.",
            "Drinking more water and less caffeine after {time} often helps with {symptom}.",
            "{person} recommended the physiotherapist near the {city} clinic; sessions "
            "cost {money}.",
            "The blood test results should be ready {num} days after the appointment.",
        ),
        (
            "can I take {med} with coffee",
            "appointment with Dr {surname}",
            "stretches for {symptom}",
            "sleep tracking advice",
            "physiotherapist {person} recommended",
        ),
    ),
    Topic(
        "cooking",
        (
            "What can I cook tonight with {ingredient}, rice and whatever is in the fridge?",
            "I'm hosting {num} people on {weekday}; one is vegetarian. Menu ideas with {food}?",
            "My {food} always comes out bland. What am I doing wrong?",
            "Can you scale {person}'s {food} recipe from four to {num} servings?",
        ),
        (
            "Toast the {ingredient} first; it brings out far more flavour than adding it raw.",
            "For {num} people you need about {num2}00 grams of rice and two onions.",
            "Season in layers: a little salt at each stage instead of all at the end.",
            "{person}'s {food} uses {ingredient} and {ingredient2}; double both for {num} "
            "servings.",
            "A vegetarian main of {food} with {ingredient} works for everyone at the table.",
            "Let the {food} rest for ten minutes before serving so the juices settle.",
            "Finish with lemon juice and fresh herbs; acidity is what bland food lacks.",
            "Keep leftovers in the fridge for up to three days, or freeze them in portions.",
            "The shop on the corner in {city} sells {ingredient2} cheaper than the supermarket.",
        ),
        (
            "{food} recipe from {person}",
            "what to cook with {ingredient}",
            "menu for {num} guests vegetarian",
            "why is my {food} bland",
        ),
    ),
    Topic(
        "home",
        (
            "The {room} tap is leaking again; should I call a plumber or fix it myself?",
            "Our landlord {person} hasn't answered about the {room} mould. What are my rights?",
            "How much would it cost to repaint the {room}?",
            "The boiler shows error {code}; the service contract number is {id}.",
        ),
        (
            "A dripping tap usually needs a new washer, which costs less than {money}.",
            "Write to {person} by email so there is a dated record of the {room} problem.",
            "Under the tenancy rules the landlord must fix damp within a reasonable time.",
            "Repainting a {room} takes about {num} litres of paint and a weekend.",
            "Error {code} on that boiler model means low water pressure; top it up to 1.5 bar.",
            "Quote the contract number {id} when you call the service line.",
            "The plumber {person2} quoted {money} including parts and one hour of labour.",
            "Open the {room} window for ten minutes every morning to reduce condensation.",
        ),
        (
            "boiler error {code}",
            "plumber quote for the {room}",
            "landlord {person} mould",
            "paint for the {room}",
        ),
    ),
    Topic(
        "work",
        (
            "Help me prepare the {project} status update for {person} on {weekday}.",
            "I need to ask {person} for a raise; my review is in {month}. How should I frame it?",
            "Draft an email to {company} about the delayed {project} milestone.",
            "How do I estimate the {project} migration to {tool} for the roadmap?",
            "Can you review this {lang} function from PR {id}? It times out on large inputs.",
        ),
        (
            "The {project} milestone slipped {num} weeks because the {tool} upgrade took longer.",
            "Lead with the outcome: {project} now handles {num2} thousand requests a day.",
            "Ask for a specific number; {money} is in line with the market for the role.",
            "{person} prefers short updates: three bullet points and one risk.",
            "PR {id} loops over the whole list for every item, which is quadratic; use a "
            "dictionary.",
            "In {lang} a generator avoids building the full list in memory.",
            "The contract with {company} has a penalty clause after {num} weeks of delay.",
            "Break the migration into {num} steps and estimate each in days, not weeks.",
            "The next {project} review with {person2} is on {weekday} at {time}.",
            "Mention the on-call work during the {service} incident; it is easy to forget.",
        ),
        (
            "{project} status update",
            "PR {id} review",
            "raise conversation with {person}",
            "email to {company} about the delay",
            "estimate migration to {tool}",
        ),
    ),
    Topic(
        "study",
        (
            "I have a {subject} exam on {day} {month}; can you make me a revision plan?",
            "Explain the part of {subject} about {concept} like I'm new to it.",
            "My {subject} course ({id}) requires an essay; how do I structure it?",
        ),
        (
            "Spread the {subject} revision over {num} sessions of ninety minutes each.",
            "Start with past papers; they show which parts of {subject} come up every year.",
            "{concept} is easiest to see with a small worked example before the general rule.",
            "The essay for {id} needs an argument in the first paragraph, not a summary.",
            "{person} from the study group shares notes every {weekday}.",
            "Test yourself without notes; recognising an answer is not the same as recalling it.",
            "The exam in {month} is {num2} hours long and closed book.",
        ),
        (
            "{subject} revision plan",
            "explain {concept}",
            "essay structure for {id}",
            "when is the {subject} exam",
        ),
    ),
)

_CONCEPTS = (
    "eigenvalues",
    "conditional probability",
    "chirality",
    "elasticity",
    "the subjunctive",
    "modulation",
    "judicial review",
    "entropy",
)
_TABLES = _words("orders invoices sessions events payments users shipments")
_THINGS = ("a house deposit", "a new laptop", "a wedding", "a car", "a sabbatical", "solar panels")
_SURNAMES = _words("Okafor Lindqvist Tanaka Moreau Kowalski Haddad Ferreira Novak")

_FILLERS = (
    "Let me know if you want more detail on any of this.",
    "That is the short version; the details depend on your situation.",
    "Here is how I would approach it, step by step.",
    "First, a quick summary of what you told me.",
    "One more thing worth checking before you decide.",
    "In practice most people find the second option easier.",
    "I would not worry about it too much yet.",
    "If anything changes, tell me and we can adjust the plan.",
)

_QUERY_PREFIXES = ("", "", "", "what did you say about ", "remind me about ", "find ")


@dataclass
class Persona:
    """The recurring entities of one principal: it talks about these again and again."""

    people: list[str]
    cities: list[str]
    ids: list[str]
    projects: list[str]
    services: list[str]
    foods: list[str]
    surname: str
    company: str
    bank: str


def _persona(rng: random.Random) -> Persona:
    return Persona(
        people=rng.sample(_FIRST, 5),
        cities=rng.sample(_CITIES, 4),
        ids=[_make_id(rng) for _ in range(12)],
        projects=rng.sample(_PROJECTS, 3),
        services=rng.sample(_SERVICES, 3),
        foods=rng.sample(_FOODS, 4),
        surname=rng.choice(_SURNAMES),
        company=rng.choice(_COMPANIES),
        bank=rng.choice(_BANKS),
    )


@dataclass(frozen=True)
class Turn:
    """One finished turn, as a caller would send it to IndexTurn."""

    conversation_id: str
    turn_id: str
    question: str
    answer: str
    turn_time: datetime
    chunks: tuple[str, ...]  # split_turn(question, answer): exactly what the server indexes


@dataclass
class PrincipalCorpus:
    """A principal's turns (and the persona they were drawn from)."""

    tenant_id: str
    principal_id: str
    persona: Persona
    turns: list[Turn] = field(default_factory=list)

    @property
    def chunk_count(self) -> int:
        return sum(len(t.chunks) for t in self.turns)


class _Filler:
    """Fills template slots: mostly from the persona, sometimes from the global pools.

    Only the slots a template names are drawn (the slot names of each template are parsed
    once), which keeps generating 100,000 chunks to seconds.
    """

    def __init__(self, rng: random.Random, persona: Persona) -> None:
        self._rng = rng
        p = persona

        def own(values: list[str], pool: Sequence[str]) -> Callable[[], str]:
            return lambda: rng.choice(values) if rng.random() < 0.7 else rng.choice(pool)

        def usual(value: str, pool: Sequence[str]) -> Callable[[], str]:
            return lambda: value if rng.random() < 0.8 else rng.choice(pool)

        def number(low: int, high: int) -> Callable[[], str]:
            return lambda: str(rng.randint(low, high))

        def money(low: int, high: int) -> Callable[[], str]:
            return lambda: f"{rng.choice('€$£')}{rng.randint(low, high)}"

        self._slots: dict[str, Callable[[], str]] = {
            "person": own(p.people, _FIRST),
            "person2": own(p.people, _FIRST),
            "city": own(p.cities, _CITIES),
            "city2": own(p.cities, _CITIES),
            "id": lambda: rng.choice(p.ids) if rng.random() < 0.7 else _make_id(rng),
            "id2": lambda: rng.choice(p.ids) if rng.random() < 0.7 else _make_id(rng),
            "project": own(p.projects, _PROJECTS),
            "service": own(p.services, _SERVICES),
            "food": own(p.foods, _FOODS),
            "surname": usual(p.surname, _SURNAMES),
            "company": usual(p.company, _COMPANIES),
            "bank": usual(p.bank, _BANKS),
            "airline": lambda: rng.choice(_AIRLINES),
            "tool": lambda: rng.choice(_TOOLS),
            "tool2": lambda: rng.choice(_TOOLS),
            "lang": lambda: rng.choice(_LANGS),
            "ingredient": lambda: rng.choice(_INGREDIENTS),
            "ingredient2": lambda: rng.choice(_INGREDIENTS),
            "symptom": lambda: rng.choice(_SYMPTOMS),
            "med": lambda: rng.choice(_MEDS),
            "subject": lambda: rng.choice(_SUBJECTS),
            "concept": lambda: rng.choice(_CONCEPTS),
            "room": lambda: rng.choice(_ROOMS),
            "table": lambda: rng.choice(_TABLES),
            "thing": lambda: rng.choice(_THINGS),
            "month": lambda: rng.choice(_MONTHS),
            "weekday": lambda: rng.choice(_WEEKDAYS),
            "day": number(1, 28),
            "time": lambda: f"{rng.randint(6, 22):02d}:{rng.choice(('00', '15', '30', '45'))}",
            "num": number(2, 40),
            "num2": number(2, 90),
            "money": money(12, 4800),
            "money2": money(50, 900),
            "version": lambda: f"v{rng.randint(1, 9)}.{rng.randint(0, 40)}.{rng.randint(0, 9)}",
            "code": lambda: f"{rng.choice('EFH')}{rng.randint(10, 99)}",
        }

    def fill(self, template: str) -> str:
        return template.format(**{name: self._slots[name]() for name in _slot_names(template)})


@functools.cache
def _slot_names(template: str) -> tuple[str, ...]:
    # In order of appearance (a set would draw the slots in a per-process hash order).
    names = (name for _, name, _, _ in string.Formatter().parse(template) if name)
    return tuple(dict.fromkeys(names))


def answer_sentences(rng: random.Random) -> int:
    """Sentences in one answer: log-normal, median 14, clipped to 2..120."""
    return max(2, min(120, round(math.exp(rng.gauss(math.log(14), 0.9)))))


class CorpusGenerator:
    """Deterministic turns and queries for any number of principals (see the module)."""

    def __init__(self, seed: int) -> None:
        self._seed = seed
        self._start = datetime(2025, 1, 1, tzinfo=UTC)

    def _rng(self, *parts: object) -> random.Random:
        # A string seed is hashed with SHA-512 by random.seed: stable across processes.
        return random.Random(":".join(str(p) for p in (self._seed, *parts)))

    def principal(
        self, tenant_id: str, principal_id: str, chunks: int, *, tag: str = ""
    ) -> PrincipalCorpus:
        """A principal with turns until it has at least `chunks` chunks (a few more when the
        last turn is long). `tag` varies the conversation ids and texts for the same name."""
        rng = self._rng(tenant_id, principal_id, tag)
        corpus = PrincipalCorpus(
            tenant_id, principal_id, _persona(self._rng("persona", tenant_id, principal_id))
        )
        filler = _Filler(rng, corpus.persona)
        count = 0
        conversation = 0
        when = self._start + timedelta(minutes=rng.randint(0, 60 * 24 * 30))
        while count < chunks:
            conversation += 1
            topic = rng.choice(TOPICS)
            conversation_id = f"conv-{tag}{conversation:05d}-{rng.getrandbits(32):08x}"
            for number in range(1, rng.randint(1, 12) + 1):
                turn = self._turn(rng, filler, topic, conversation_id, f"turn-{number}", when)
                corpus.turns.append(turn)
                count += len(turn.chunks)
                when += timedelta(minutes=rng.randint(1, 30))
                if count >= chunks:
                    break
            when += timedelta(hours=rng.randint(1, 72))
        return corpus

    @staticmethod
    def _turn(
        rng: random.Random,
        filler: _Filler,
        topic: Topic,
        conversation_id: str,
        turn_id: str,
        when: datetime,
    ) -> Turn:
        question = filler.fill(rng.choice(topic.questions))
        if rng.random() < 0.3:  # some questions carry context
            question += " " + filler.fill(rng.choice(topic.sentences))
        parts: list[str] = []
        for i in range(answer_sentences(rng)):
            if i and rng.random() < 0.08:
                parts.append("\n\n")
            elif i:
                parts.append(" ")
            source = _FILLERS if rng.random() < 0.1 else topic.sentences
            parts.append(filler.fill(rng.choice(source)))
        answer = "".join(parts)
        chunks = split_turn(question, answer).chunks
        return Turn(conversation_id, turn_id, question, answer, when, chunks)

    def queries(self, corpus: PrincipalCorpus, count: int) -> list[str]:
        """`count` distinct search queries about the principal's own turns (see the module):
        about 25% ids it mentions, 35% a few consecutive words of one of its sentences, 40%
        natural questions about its persona's entities."""
        rng = self._rng("queries", corpus.tenant_id, corpus.principal_id)
        filler = _Filler(rng, corpus.persona)
        mentioned = sorted(
            {i for i in corpus.persona.ids if any(i in t.answer for t in corpus.turns)}
        )
        seen: set[str] = set()
        queries: list[str] = []
        attempts = 0
        while len(queries) < count and attempts < count * 50:
            attempts += 1
            kind = rng.random()
            if kind < 0.25 and mentioned:
                query = rng.choice(["{id}", "{id} status", "what happened with {id}", "{id}"])
                query = query.format(id=rng.choice(mentioned))
            elif kind < 0.6:
                query = rng.choice(_QUERY_PREFIXES) + _snippet(rng, rng.choice(corpus.turns))
            else:
                query = filler.fill(rng.choice(rng.choice(TOPICS).asks))
            if query not in seen:
                seen.add(query)
                queries.append(query)
        return queries


def _snippet(rng: random.Random, turn: Turn) -> str:
    """Three to seven consecutive words of one sentence of the turn, without punctuation."""
    sentences = [s for s in turn.answer.replace("\n", " ").split(". ") if len(s.split()) >= 3]
    words = rng.choice(sentences or [turn.question]).split()
    size = min(len(words), rng.randint(3, 7))
    start = rng.randint(0, len(words) - size)
    return " ".join(w.strip(".,;:?!()'") for w in words[start : start + size])


def chunk_counts(total: int, principals: int, rng: random.Random) -> list[int]:
    """How `total` chunks spread over `principals`: log-normal (sigma 1), at least 20 each,
    rescaled to sum to about `total`; a few heavy users and many light ones."""
    weights = [math.exp(rng.gauss(0, 1.0)) for _ in range(principals)]
    scale = total / sum(weights)
    counts = [max(20, round(w * scale)) for w in weights]
    excess = sum(counts) - total
    for i in sorted(range(principals), key=lambda j: -counts[j]):  # trim the heaviest
        if excess <= 0:
            break
        cut = min(excess, counts[i] - 20)
        counts[i] -= cut
        excess -= cut
    return counts


class LengthStats:
    """Turn and chunk counts and turn lengths, accumulated without keeping the turns."""

    def __init__(self, turns: Iterable[Turn] = ()) -> None:
        self._chunks: list[int] = []
        self._chars: list[int] = []
        self.add(turns)

    def add(self, turns: Iterable[Turn]) -> None:
        for turn in turns:
            self._chunks.append(len(turn.chunks))
            self._chars.append(sum(len(c) for c in turn.chunks))

    def __str__(self) -> str:
        """One line: turns, chunks per turn, share of split turns, turn text lengths."""
        if not self._chunks:
            return "no turns"
        turns, chunks = len(self._chunks), sum(self._chunks)
        chars = sorted(self._chars)
        split = sum(1 for n in self._chunks if n > 1) / turns
        return (
            f"{turns} turns, {chunks} chunks ({chunks / turns:.2f} per turn, "
            f"{split:.0%} of turns split), turn text p50 {chars[turns // 2]} chars, "
            f"p90 {chars[turns * 9 // 10]}, max {chars[-1]}"
        )


def describe(turns: Iterable[Turn]) -> str:
    """One line of statistics about `turns` (see LengthStats)."""
    return str(LengthStats(turns))


def keyword_vectors(corpus: PrincipalCorpus, keywords: KeywordEncoder) -> list[list[SparseVector]]:
    """Per turn of `corpus`, its chunks' keyword vectors as the index worker leaves them (the
    current representation: the date, the text and, at CONTEXT_WEIGHT, the chunk before and
    the chunk after in its conversation; server/domain/context.py). The corpus lists each
    conversation's turns in order."""
    texts: dict[str, list[str]] = {}
    for turn in corpus.turns:
        texts.setdefault(turn.conversation_id, []).extend(turn.chunks)
    seen: dict[str, int] = {}
    out = []
    for turn in corpus.turns:
        around = texts[turn.conversation_id]
        vectors = []
        for text in turn.chunks:
            at = seen.get(turn.conversation_id, 0)
            seen[turn.conversation_id] = at + 1
            context = around[max(at - 1, 0) : at] + around[at + 1 : at + 2]
            own = keyword_document(text, turn.turn_time)
            vectors.append(keywords.encode_in_context(own, context))
        out.append(vectors)
    return out
