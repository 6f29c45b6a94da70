"""The apps' worlds, task templates and scenarios, and how a task's outcome is judged.

A **world** is one initial database (contacts, events, notes, products, payments) generated from a
seed. A **template** is a kind of task with parameters ("Send {amount} dollars to {name} for
{note}."); a **scenario** is three tasks of one template on one world with different parameters,
as in AppWorld. Success is judged on state, as AppWorld's tests do: the episode's final database
must equal the initial one with the template's reference solution applied (no more, no fewer
changes), and, for a question, the answer given to `complete_task` must match.

Each template also has an expert program written the way SAGE's agent should work: on the first
task of a chain it defines a reusable function and calls it; when that function is already in the
chain's skill library it only calls it. The reference solutions are separate code, so the expert
is tested against them rather than against itself.
"""

from __future__ import annotations

import dataclasses
import hashlib
import random
import sqlite3
from collections.abc import Callable
from typing import Any

from skilljax.envs.apps import api

FIRST = ("Alice", "Bruno", "Chiara", "Dmitri", "Elena", "Farid", "Greta", "Hiro", "Ines", "Jonas",
         "Kemal", "Lucia", "Marek", "Nadia", "Omar", "Priya", "Quentin", "Rosa", "Stefan", "Tamar")
LAST = ("Novak", "Okafor", "Silva", "Berg", "Kowalski", "Moreau", "Tanaka", "Haddad", "Larsen",
        "Petrov", "Quinn", "Rossi", "Sato", "Varga", "Weber", "Yilmaz")
CITIES = ("Lisbon", "Oslo", "Porto", "Riga", "Turin", "Ghent", "Lyon", "Bergen", "Cork", "Graz")
PRODUCTS = ("lamp", "kettle", "blanket", "notebook", "umbrella", "backpack", "candle", "teapot",
            "scarf", "mug", "pillow", "toaster")
EVENT_TITLES = ("lunch", "meeting", "call", "dinner", "review", "walk", "coffee")
PAY_NOTES = ("rent", "dinner", "tickets", "books", "taxi", "gift", "groceries")
NOTE_TITLES = ("phone list", "contact info", "numbers", "to call", "address book")
WORLD_CONTACTS = 10
WORLD_PRODUCTS = 8
SCENARIO_SIZE = 3


def _seed(*key) -> int:
    return int.from_bytes(hashlib.sha256(repr(key).encode()).digest()[:8], "little")


def build_world(conn: sqlite3.Connection, world_seed: int) -> None:
    """Fills an empty database (`api.create`) with the world of `world_seed`."""
    rng = random.Random(world_seed)
    names = rng.sample([f"{f} {l}" for f in FIRST for l in LAST], WORLD_CONTACTS)
    for name in names:
        first = name.split()[0].lower()
        conn.execute("INSERT INTO contacts (name, phone, email, city) VALUES (?, ?, ?, ?)",
                     (name, f"555-{rng.randrange(1000, 10000)}", f"{first}@mail.test",
                      rng.choice(CITIES)))
    for _ in range(rng.randrange(8, 14)):
        conn.execute("INSERT INTO events (title, date, contact_id) VALUES (?, ?, ?)",
                     (rng.choice(EVENT_TITLES), f"2024-{rng.randrange(1, 13):02d}-"
                      f"{rng.randrange(1, 29):02d}", rng.randrange(1, WORLD_CONTACTS + 1)))
    for title in rng.sample(("groceries", "ideas", "travel", "books"), 2):
        conn.execute("INSERT INTO notes (title, body) VALUES (?, ?)", (title, "-"))
    for name in rng.sample(PRODUCTS, WORLD_PRODUCTS):
        conn.execute("INSERT INTO products (name, price, stock) VALUES (?, ?, ?)",
                     (name, rng.randrange(3, 60), rng.randrange(5, 20)))
    for _ in range(rng.randrange(8, 14)):
        conn.execute("INSERT INTO payments (contact_id, amount, note) VALUES (?, ?, ?)",
                     (rng.randrange(1, WORLD_CONTACTS + 1), rng.randrange(5, 120),
                      rng.choice(PAY_NOTES)))
    conn.commit()


def world_facts(world_seed: int) -> dict[str, list]:
    """What templates draw parameters from: contact names, their cities, the contacts with events
    and with payments (so a question's answer is never 0, which a guess would hit), product names
    (stock > 3)."""
    conn = api.create(":memory:")
    build_world(conn, world_seed)
    names = lambda sql: [r[0] for r in conn.execute(sql)]
    facts = {
        "contacts": names("SELECT name FROM contacts ORDER BY id"),
        "cities": names("SELECT city FROM contacts ORDER BY id"),
        "with_events": names("SELECT name FROM contacts WHERE id IN "
                             "(SELECT contact_id FROM events) ORDER BY id"),
        "with_payments": names("SELECT name FROM contacts WHERE id IN "
                               "(SELECT contact_id FROM payments) ORDER BY id"),
        "products": names("SELECT name FROM products WHERE stock > 3 ORDER BY id")}
    conn.close()
    return facts


# ---------------------------------------------------------------------------- templates

@dataclasses.dataclass(frozen=True)
class Template:
    name: str
    instruction: str                                   # str.format over the parameters
    params: Callable[[random.Random, dict], dict]      # (rng, world facts) -> parameters
    function: str                                      # the expert's reusable function
    arguments: tuple[str, ...]                         # its parameters, in order
    returns_answer: bool                               # a question: complete_task(answer=...)
    reference: Callable[[api.Apis, dict], Any]         # the reference solution; returns the answer

    def expert_code(self, params: dict, library: tuple[str, ...] = ()) -> str:
        """The expert's cell: define the function unless the library has it, call it, finish."""
        call = f"{self.name}({', '.join(repr(params[a]) for a in self.arguments)})"
        lines = [] if self.name in library else [self.function.strip(), ""]
        if self.returns_answer:
            lines.append(f"apis.supervisor.complete_task(answer={call})")
        else:
            lines += [call, "apis.supervisor.complete_task()"]
        return "\n".join(lines)


def _contact(apis: api.Apis, name: str) -> dict:
    found = [c for c in apis.contacts.search("") if c["name"] == name]
    if len(found) != 1:
        raise ValueError(f"world has {len(found)} contacts named {name!r}")
    return found[0]


def _ref_move(apis, p):
    apis.contacts.update(_contact(apis, p["name"])["id"], city=p["city"])


def _ref_pay(apis, p):
    apis.payments.send(_contact(apis, p["name"])["id"], p["amount"], p["note"])


def _ref_buy(apis, p):
    product = [x for x in apis.shop.search("") if x["name"] == p["product"]][0]
    apis.shop.buy(product["id"], p["quantity"])


def _ref_count(apis, p):
    return len(apis.calendar.list_events(contact_id=_contact(apis, p["name"])["id"]))


def _ref_note(apis, p):
    apis.notes.create(p["title"], _contact(apis, p["name"])["phone"])


def _ref_total(apis, p):
    cid = _contact(apis, p["name"])["id"]
    return sum(x["amount"] for x in apis.payments.history(cid))


def _new_city(rng, facts):
    """A contact and a city that is not already theirs (else doing nothing would succeed)."""
    i = rng.randrange(len(facts["contacts"]))
    return {"name": facts["contacts"][i],
            "city": rng.choice([c for c in CITIES if c != facts["cities"][i]])}


TEMPLATES: dict[str, Template] = {t.name: t for t in (
    Template(
        "move_contact", "{name} moved to {city}: update the contact's city.",
        _new_city,
        '''
def move_contact(name, city):
    contact = apis.contacts.search(name)[0]
    apis.contacts.update(contact["id"], city=city)
''', ("name", "city"), False, _ref_move),
    Template(
        "pay_contact", "Send {amount} dollars to {name} for {note}.",
        lambda rng, f: {"name": rng.choice(f["contacts"]), "amount": rng.randrange(5, 200),
                        "note": rng.choice(PAY_NOTES)},
        '''
def pay_contact(name, amount, note):
    contact = apis.contacts.search(name)[0]
    apis.payments.send(contact["id"], amount, note)
''', ("name", "amount", "note"), False, _ref_pay),
    Template(
        "buy_product", "Buy {quantity} {product} from the shop.",
        lambda rng, f: {"product": rng.choice(f["products"]), "quantity": rng.randrange(1, 4)},
        '''
def buy_product(product, quantity):
    item = apis.shop.search(product)[0]
    apis.shop.buy(item["id"], quantity)
''', ("product", "quantity"), False, _ref_buy),
    Template(
        "count_events", "How many calendar events do you have with {name}?",
        lambda rng, f: {"name": rng.choice(f["with_events"])},
        '''
def count_events(name):
    contact = apis.contacts.search(name)[0]
    return len(apis.calendar.list_events(contact_id=contact["id"]))
''', ("name",), True, _ref_count),
    Template(
        "save_phone", "Create a note titled '{title}' holding {name}'s phone number.",
        lambda rng, f: {"name": rng.choice(f["contacts"]), "title": rng.choice(NOTE_TITLES)},
        '''
def save_phone(name, title):
    contact = apis.contacts.search(name)[0]
    apis.notes.create(title, contact["phone"])
''', ("name", "title"), False, _ref_note),
    Template(
        "total_paid", "How many dollars have you sent to {name} in total?",
        lambda rng, f: {"name": rng.choice(f["with_payments"])},
        '''
def total_paid(name):
    contact = apis.contacts.search(name)[0]
    return sum(p["amount"] for p in apis.payments.history(contact["id"]))
''', ("name",), True, _ref_total),
)}


def scenario_params(template: Template, world_seed: int, scenario_seed: int,
                    size: int = SCENARIO_SIZE) -> list[dict]:
    """`size` parameter sets of one template on one world, pairwise different (and different in
    the first parameter, so no task repeats another's contact or product)."""
    facts = world_facts(world_seed)
    rng = random.Random(scenario_seed)
    out: list[dict] = []
    first = template.arguments[0]
    for _ in range(1000):
        p = template.params(rng, facts)
        if all(p[first] != q[first] for q in out):
            out.append(p)
            if len(out) == size:
                return out
    raise RuntimeError(f"could not draw {size} different tasks of {template.name}")


# ---------------------------------------------------------------------------- judging

def expected_outcome(template: Template, params: dict, world_seed: int
                     ) -> tuple[dict[str, list[tuple]], str | None]:
    """(final state, answer as repr or None) of the reference solution on the world."""
    conn = api.create(":memory:")
    build_world(conn, world_seed)
    answer = template.reference(api.Apis(conn), params)
    final = api.state(conn)
    conn.close()
    return final, (None if answer is None else repr(answer))


def answers_match(given: str | None, expected: str | None) -> bool:
    """Answers compared as AppWorld does, loosely: numbers by value, text case- and
    space-insensitively; no expected answer accepts any."""
    if expected is None:
        return True
    if given is None:
        return False
    import ast
    try:
        g, e = ast.literal_eval(given), ast.literal_eval(expected)
    except (ValueError, SyntaxError):
        return False
    if isinstance(e, (int, float)) and not isinstance(e, bool):
        if isinstance(g, str):
            try:
                g = float(g.strip())
            except ValueError:
                return False
        return isinstance(g, (int, float)) and not isinstance(g, bool) and abs(g - e) < 1e-6
    return " ".join(str(g).split()).lower() == " ".join(str(e).split()).lower()


def diff(final: dict[str, list[tuple]], expected: dict[str, list[tuple]]) -> list[str]:
    """Tables whose rows differ from the expected state (for the episode's info)."""
    return [t for t in api.STATE_TABLES if final.get(t) != expected.get(t)]
