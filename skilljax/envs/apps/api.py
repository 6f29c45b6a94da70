"""The apps' Python APIs over one SQLite database: what agent code calls as `apis.<app>.<api>(...)`.

Five apps (contacts, calendar, notes, shop, payments), an `api_docs` app that documents the others,
and a `supervisor` app whose `complete_task(answer=None)` ends the task, as in AppWorld. The same
classes serve two sides: inside the sandbox (the episode's setup binds `apis = connect(path)`; the
agent's cells call it) and on the host, where the environment builds a world's initial database
and applies a task's reference solution to a copy of it (`envs/apps/tasks.py`).

Every API validates its arguments and raises `APIError` with a message that names the problem
(an unknown id, a missing field, too little stock); writes are committed at once, so the host sees
them between cells. Results are plain dicts and lists (JSON-like), so printing them shows the data.
This module imports only the standard library: it runs in the sandbox's child interpreter.
"""

from __future__ import annotations

import inspect
import sqlite3

SCHEMA = """
CREATE TABLE contacts (id INTEGER PRIMARY KEY, name TEXT NOT NULL, phone TEXT NOT NULL,
                       email TEXT NOT NULL, city TEXT NOT NULL);
CREATE TABLE events (id INTEGER PRIMARY KEY, title TEXT NOT NULL, date TEXT NOT NULL,
                     contact_id INTEGER);
CREATE TABLE notes (id INTEGER PRIMARY KEY, title TEXT NOT NULL, body TEXT NOT NULL);
CREATE TABLE products (id INTEGER PRIMARY KEY, name TEXT NOT NULL, price INTEGER NOT NULL,
                       stock INTEGER NOT NULL);
CREATE TABLE orders (id INTEGER PRIMARY KEY, product_id INTEGER NOT NULL,
                     quantity INTEGER NOT NULL, total INTEGER NOT NULL);
CREATE TABLE payments (id INTEGER PRIMARY KEY, contact_id INTEGER NOT NULL,
                       amount INTEGER NOT NULL, note TEXT NOT NULL);
CREATE TABLE supervisor (id INTEGER PRIMARY KEY CHECK (id = 1), completed INTEGER NOT NULL,
                         answer TEXT);
INSERT INTO supervisor VALUES (1, 0, NULL);
"""
STATE_TABLES = ("contacts", "events", "notes", "products", "orders", "payments")


class APIError(Exception):
    """An API call that cannot be done as asked; the message says why."""


def _rows(cursor) -> list[dict]:
    names = [d[0] for d in cursor.description]
    return [dict(zip(names, row)) for row in cursor.fetchall()]


def _positive_int(api: str, name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise APIError(f"{api}: {name} must be a positive integer, got {value!r}.")
    return value


def _text(api: str, name: str, value, allow_empty: bool = False) -> str:
    if not isinstance(value, str) or (not allow_empty and not value.strip()):
        raise APIError(f"{api}: {name} must be a non-empty string, got {value!r}.")
    return value


class _App:
    """Base of the apps: public methods are the APIs; their docstrings are the documentation."""

    description = ""

    def __init__(self, conn: sqlite3.Connection):
        self._conn = conn

    def _one(self, api: str, table: str, row_id) -> dict:
        _positive_int(api, "id", row_id)
        rows = _rows(self._conn.execute(f"SELECT * FROM {table} WHERE id = ?", (row_id,)))
        if not rows:
            raise APIError(f"{api}: no {table[:-1]} with id {row_id}.")
        return rows[0]

    def _insert(self, table: str, **fields) -> int:
        cols = ", ".join(fields)
        marks = ", ".join("?" for _ in fields)
        cur = self._conn.execute(f"INSERT INTO {table} ({cols}) VALUES ({marks})",
                                 tuple(fields.values()))
        self._conn.commit()
        return cur.lastrowid

    @classmethod
    def api_names(cls) -> list[str]:
        return [n for n, f in inspect.getmembers(cls, inspect.isfunction) if not n.startswith("_")
                and n != "api_names"]


class Contacts(_App):
    description = "People you know: names, phone numbers, emails and cities."

    def search(self, query: str = "") -> list[dict]:
        """Contacts whose name contains `query` (case-insensitive); all contacts for ""."""
        _text("contacts.search", "query", query, allow_empty=True)
        return _rows(self._conn.execute(
            "SELECT * FROM contacts WHERE instr(lower(name), lower(?)) > 0 ORDER BY id", (query,)))

    def show(self, contact_id: int) -> dict:
        """The contact with this id."""
        return self._one("contacts.show", "contacts", contact_id)

    def update(self, contact_id: int, phone: str | None = None, email: str | None = None,
               city: str | None = None) -> dict:
        """Changes the given fields of a contact; returns the updated contact."""
        self._one("contacts.update", "contacts", contact_id)
        fields = {k: v for k, v in (("phone", phone), ("email", email), ("city", city))
                  if v is not None}
        if not fields:
            raise APIError("contacts.update: give at least one of phone, email, city.")
        for k, v in fields.items():
            _text("contacts.update", k, v)
        sets = ", ".join(f"{k} = ?" for k in fields)
        self._conn.execute(f"UPDATE contacts SET {sets} WHERE id = ?",
                           (*fields.values(), contact_id))
        self._conn.commit()
        return self.show(contact_id)

    def add(self, name: str, phone: str, email: str = "", city: str = "") -> int:
        """Adds a contact; returns its id."""
        _text("contacts.add", "name", name)
        _text("contacts.add", "phone", phone)
        return self._insert("contacts", name=name, phone=phone, email=email, city=city)


class Calendar(_App):
    description = "Events with a title, a date (YYYY-MM-DD) and optionally a contact."

    def list_events(self, contact_id: int | None = None, date: str | None = None) -> list[dict]:
        """Events, optionally only those with a contact and/or on a date."""
        sql, args = "SELECT * FROM events WHERE 1", []
        if contact_id is not None:
            sql, args = sql + " AND contact_id = ?", args + [_positive_int(
                "calendar.list_events", "contact_id", contact_id)]
        if date is not None:
            sql, args = sql + " AND date = ?", args + [_text("calendar.list_events", "date", date)]
        return _rows(self._conn.execute(sql + " ORDER BY date, id", args))

    def add_event(self, title: str, date: str, contact_id: int | None = None) -> int:
        """Adds an event; returns its id."""
        _text("calendar.add_event", "title", title)
        if not isinstance(date, str) or len(date) != 10 or date[4] != "-" or date[7] != "-":
            raise APIError(f"calendar.add_event: date must look like 2024-05-17, got {date!r}.")
        if contact_id is not None:
            Contacts(self._conn)._one("calendar.add_event", "contacts", contact_id)
        return self._insert("events", title=title, date=date, contact_id=contact_id)

    def delete_event(self, event_id: int) -> None:
        """Deletes an event."""
        self._one("calendar.delete_event", "events", event_id)
        self._conn.execute("DELETE FROM events WHERE id = ?", (event_id,))
        self._conn.commit()


class Notes(_App):
    description = "Notes with a title and a body."

    def search(self, query: str = "") -> list[dict]:
        """Notes whose title contains `query` (case-insensitive); all notes for ""."""
        _text("notes.search", "query", query, allow_empty=True)
        return _rows(self._conn.execute(
            "SELECT * FROM notes WHERE instr(lower(title), lower(?)) > 0 ORDER BY id", (query,)))

    def create(self, title: str, body: str) -> int:
        """Creates a note; returns its id."""
        _text("notes.create", "title", title)
        _text("notes.create", "body", body, allow_empty=True)
        return self._insert("notes", title=title, body=body)

    def append(self, note_id: int, text: str) -> dict:
        """Appends a line to a note's body; returns the note."""
        note = self._one("notes.append", "notes", note_id)
        _text("notes.append", "text", text)
        body = note["body"] + ("\n" if note["body"] else "") + text
        self._conn.execute("UPDATE notes SET body = ? WHERE id = ?", (body, note_id))
        self._conn.commit()
        return self._one("notes.append", "notes", note_id)


class Shop(_App):
    description = "Products with a price and a stock; buying makes an order."

    def search(self, query: str = "") -> list[dict]:
        """Products whose name contains `query` (case-insensitive); all products for ""."""
        _text("shop.search", "query", query, allow_empty=True)
        return _rows(self._conn.execute(
            "SELECT * FROM products WHERE instr(lower(name), lower(?)) > 0 ORDER BY id", (query,)))

    def buy(self, product_id: int, quantity: int = 1) -> dict:
        """Orders `quantity` units of a product (stock permitting); returns the order."""
        product = self._one("shop.buy", "products", product_id)
        _positive_int("shop.buy", "quantity", quantity)
        if product["stock"] < quantity:
            raise APIError(f"shop.buy: only {product['stock']} {product['name']} in stock.")
        self._conn.execute("UPDATE products SET stock = stock - ? WHERE id = ?",
                           (quantity, product_id))
        order_id = self._insert("orders", product_id=product_id, quantity=quantity,
                                total=quantity * product["price"])
        return self._one("shop.buy", "orders", order_id)

    def orders(self) -> list[dict]:
        """All orders made."""
        return _rows(self._conn.execute("SELECT * FROM orders ORDER BY id"))


class Payments(_App):
    description = "Money sent to contacts (whole dollars), with a note."

    def send(self, contact_id: int, amount: int, note: str = "") -> dict:
        """Sends `amount` dollars to a contact; returns the payment."""
        Contacts(self._conn)._one("payments.send", "contacts", contact_id)
        _positive_int("payments.send", "amount", amount)
        _text("payments.send", "note", note, allow_empty=True)
        payment_id = self._insert("payments", contact_id=contact_id, amount=amount, note=note)
        return self._one("payments.send", "payments", payment_id)

    def history(self, contact_id: int | None = None) -> list[dict]:
        """Payments made, optionally only those to one contact."""
        if contact_id is None:
            return _rows(self._conn.execute("SELECT * FROM payments ORDER BY id"))
        _positive_int("payments.history", "contact_id", contact_id)
        return _rows(self._conn.execute(
            "SELECT * FROM payments WHERE contact_id = ? ORDER BY id", (contact_id,)))


APPS = {"contacts": Contacts, "calendar": Calendar, "notes": Notes, "shop": Shop,
        "payments": Payments}


def _signature(cls, name: str) -> str:
    sig = inspect.signature(getattr(cls, name))
    parts = []
    for p in sig.parameters.values():
        if p.name == "self":
            continue
        text = p.name + (f": {p.annotation}" if p.annotation is not p.empty else "")
        if p.default is not p.empty:
            text += f" = {p.default!r}"
        parts.append(text)
    return f"{name}({', '.join(parts)})"


def api_doc(app_name: str, api_name: str) -> str:
    cls = APPS[app_name]
    return f"apis.{app_name}.{_signature(cls, api_name)}: {inspect.getdoc(getattr(cls, api_name))}"


class ApiDocs:
    """Documentation of the apps, as text (print it)."""

    description = "Documentation of the apps and their APIs."

    def show_app_descriptions(self) -> str:
        """One line per app."""
        return "\n".join(f"{name}: {cls.description}" for name, cls in APPS.items())

    def show_api_descriptions(self, app_name: str) -> str:
        """One line per API of an app: its signature and what it does."""
        self._app(app_name)
        return "\n".join(api_doc(app_name, n) for n in APPS[app_name].api_names())

    def show_api_doc(self, app_name: str, api_name: str) -> str:
        """The signature and description of one API."""
        cls = self._app(app_name)
        if api_name not in cls.api_names():
            raise APIError(f"api_docs.show_api_doc: {app_name} has no API {api_name!r}; it has "
                           f"{', '.join(cls.api_names())}.")
        return api_doc(app_name, api_name)

    @staticmethod
    def _app(app_name):
        if app_name not in APPS:
            raise APIError(f"api_docs: no app {app_name!r}; the apps are {', '.join(APPS)}.")
        return APPS[app_name]


class Supervisor(_App):
    description = "Ends the task."

    def complete_task(self, answer=None) -> str:
        """Ends the task; pass `answer` when the task asks a question."""
        if answer is not None and not isinstance(answer, (str, int, float)):
            raise APIError("supervisor.complete_task: answer must be a string or a number, got "
                           f"{type(answer).__name__}.")
        self._conn.execute("UPDATE supervisor SET completed = 1, answer = ? WHERE id = 1",
                           (None if answer is None else repr(answer),))
        self._conn.commit()
        return "Task completed."


class Apis:
    """`apis`: one attribute per app."""

    def __init__(self, conn: sqlite3.Connection):
        for name, cls in APPS.items():
            setattr(self, name, cls(conn))
        self.api_docs = ApiDocs()
        self.supervisor = Supervisor(conn)

    def __repr__(self):
        return f"<apis: {', '.join(list(APPS) + ['api_docs', 'supervisor'])}>"


def create(path: str) -> sqlite3.Connection:
    """A new, empty database at `path` with the apps' tables."""
    conn = sqlite3.connect(path)
    conn.executescript(SCHEMA)
    conn.commit()
    return conn


def connect(path: str) -> Apis:
    """The APIs over the database at `path` (the sandbox's setup calls this)."""
    conn = sqlite3.connect(path, isolation_level="DEFERRED")
    conn.setlimit(sqlite3.SQLITE_LIMIT_ATTACHED, 0)
    return Apis(conn)


def state(conn: sqlite3.Connection) -> dict[str, list[tuple]]:
    """The apps' data (not the supervisor's), table → sorted rows: what success is judged on."""
    return {t: sorted(conn.execute(f"SELECT * FROM {t}").fetchall()) for t in STATE_TABLES}


def completion(conn: sqlite3.Connection) -> tuple[bool, str | None]:
    """(completed, answer as repr) from the supervisor's table."""
    completed, answer = conn.execute("SELECT completed, answer FROM supervisor").fetchone()
    return bool(completed), answer
