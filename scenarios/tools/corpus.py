"""A procedurally generated encyclopedia: documents no pretrained model can have memorised.

:func:`generate_world` draws a small fictional world from a ``np.random.Generator``: places,
organisations, people and events with invented names (syllables joined at random) and
consistent cross-references (a person is born in a place of the world and works for one of its
organisations; an organisation was founded by one of its people and has its headquarters in one
of its places; an event is held in a place and organised by an organisation). Every relation
points at an entity that exists, and every name is unique within the world.

:func:`render_document` writes one entity as an encyclopedia article: the title line, a prose
sentence, then ``Key: value`` fact lines (the fact lines are the contract that questions and the
scripted agents read; see :data:`RELATIONS`). :func:`load_directory` adds a user's own corpus
(one document per ``*.txt``/``*.md`` file, its first line the title), bounded in size.

Everything is a pure function of the generator's draws: the same seed gives the same world, and
nothing is cached across calls (no process-global state shared by concurrent episodes).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

import numpy as np

from parley.protocols.errors import ConfigError

__all__ = [
    "KINDS",
    "RELATIONS",
    "Document",
    "Entity",
    "World",
    "generate_world",
    "load_directory",
    "render_document",
]

KINDS = ("place", "organisation", "person", "event")
"""Entity kinds, in the order they are drawn (later kinds refer to earlier ones)."""

RELATIONS: dict[str, tuple[str, str]] = {
    "birthplace": ("person", "Birthplace"),
    "employer": ("person", "Employer"),
    "born": ("person", "Born"),
    "founder": ("organisation", "Founder"),
    "headquarters": ("organisation", "Headquarters"),
    "founded": ("organisation", "Founded"),
    "region": ("place", "Region"),
    "population": ("place", "Population"),
    "venue": ("event", "Venue"),
    "organiser": ("event", "Organiser"),
    "year": ("event", "Year"),
}
"""Relation -> (the kind of entity that has it, the key of its fact line in the article)."""

_ONSETS = ("b", "d", "f", "g", "k", "l", "m", "n", "p", "r", "s", "t", "v", "z", "th", "br")
_VOWELS = ("a", "e", "i", "o", "u", "ae", "io")
_CODAS = ("", "", "n", "r", "l", "s", "th", "nd")
_ORG_SUFFIXES = ("Guild", "Institute", "Company", "Society", "Works", "Foundation")
_EVENT_KINDS = ("Fair", "Congress", "Regatta", "Festival", "Summit", "Expedition")
_OCCUPATIONS = ("cartographer", "engineer", "botanist", "merchant", "composer", "surveyor")
_REGIONS = ("the northern coast", "the inland plateau", "the river delta", "the eastern hills")

MAX_USER_DOCUMENTS = 2000
"""Most documents :func:`load_directory` reads (a corpus directory is the user's, not the
policy's, but a mistaken path such as ``/`` must not load a disk)."""
MAX_USER_DOCUMENT_CHARS = 20_000
"""Longest user document kept, in characters (the rest is cut)."""


@dataclasses.dataclass(frozen=True)
class Entity:
    """One entity of the world: its kind, unique name and facts (relation -> value).

    A fact's value is a name of another entity (``birthplace``, ``employer``, ``founder``,
    ``headquarters``, ``venue``, ``organiser``) or a plain value (a year, a population).
    """

    kind: str
    name: str
    facts: dict[str, str]
    summary: str


@dataclasses.dataclass(frozen=True)
class Document:
    """A searchable document: a stable id, a title and the text."""

    doc_id: str
    title: str
    text: str


@dataclasses.dataclass
class World:
    """The entities of one generated world, by kind and by name (insertion order kept)."""

    entities: dict[str, Entity]

    def of_kind(self, kind: str) -> list[Entity]:
        """The entities of ``kind`` in the order they were drawn."""
        return [e for e in self.entities.values() if e.kind == kind]


def _pick(rng: np.random.Generator, options: tuple[str, ...] | list[str]) -> str:
    return options[int(rng.integers(len(options)))]


def _word(rng: np.random.Generator, syllables: int) -> str:
    parts = [_pick(rng, _ONSETS) + _pick(rng, _VOWELS) for _ in range(syllables)]
    return ("".join(parts) + _pick(rng, _CODAS)).capitalize()


def _unique(
    rng: np.random.Generator, taken: set[str], make: Callable[[np.random.Generator], str]
) -> str:
    # Names are drawn until one is new: with 16 x 7 x 8 forms per syllable, a clash is rare.
    while True:
        name = make(rng)
        if name not in taken:
            taken.add(name)
            return name


def generate_world(
    rng: np.random.Generator,
    *,
    places: int = 6,
    organisations: int = 6,
    people: int = 12,
    events: int = 4,
) -> World:
    """A world of the given sizes drawn from ``rng`` (module docstring); pure in ``rng``."""
    if min(places, organisations, people) < 2 or events < 0:
        raise ConfigError("a world needs at least 2 places, organisations and people")
    taken: set[str] = set()
    entities: dict[str, Entity] = {}

    def add(kind: str, name: str, facts: dict[str, str], summary: str) -> None:
        entities[name] = Entity(kind, name, facts, summary)

    place_names = [_unique(rng, taken, lambda r: _word(r, 2)) for _ in range(places)]
    for name in place_names:
        population = str(int(rng.integers(2, 900)) * 1000)
        region = _pick(rng, _REGIONS)
        add("place", name, {"region": region, "population": population},
            f"{name} is a town on {region}.")  # fmt: skip
    org_names = [
        _unique(rng, taken, lambda r: f"{_word(r, 2)} {_pick(r, _ORG_SUFFIXES)}")
        for _ in range(organisations)
    ]
    person_names = [
        _unique(rng, taken, lambda r: f"{_word(r, 2)} {_word(r, 2)}") for _ in range(people)
    ]
    # Every organisation is founded by a different person while there are enough of them.
    founders = [person_names[int(i)] for i in rng.permutation(people)[:organisations]]
    for i, name in enumerate(org_names):
        facts = {
            "founder": founders[i % len(founders)],
            "headquarters": _pick(rng, place_names),
            "founded": str(int(rng.integers(1700, 1990))),
        }
        add("organisation", name, facts, f"The {name} is an organisation based in "
            f"{facts['headquarters']}.")  # fmt: skip
    for name in person_names:
        occupation = _pick(rng, _OCCUPATIONS)
        facts = {
            "born": str(int(rng.integers(1650, 1960))),
            "birthplace": _pick(rng, place_names),
            "employer": _pick(rng, org_names),
        }
        add("person", name, facts, f"{name} is a {occupation}.")
    for _ in range(events):
        name = _unique(rng, taken, lambda r: f"{_word(r, 2)} {_pick(r, _EVENT_KINDS)}")
        facts = {
            "venue": _pick(rng, place_names),
            "organiser": _pick(rng, org_names),
            "year": str(int(rng.integers(1750, 2000))),
        }
        add("event", name, facts, f"The {name} is a gathering held in {facts['venue']}.")
    return World(entities)


def render_document(entity: Entity, doc_id: str) -> Document:
    """The article of ``entity``: title, summary, one ``Key: value`` line per fact."""
    lines = [entity.name, entity.summary]
    lines += [f"{RELATIONS[rel][1]}: {value}" for rel, value in entity.facts.items()]
    return Document(doc_id, entity.name, "\n".join(lines))


def load_directory(path: str | Path) -> list[Document]:
    """The ``*.txt`` and ``*.md`` files under ``path`` as documents (ids ``user:N``, sorted by
    path; the first non-empty line is the title). Raises :class:`ConfigError` when ``path``
    is not a directory; reads at most :data:`MAX_USER_DOCUMENTS` files."""
    root = Path(path)
    if not root.is_dir():
        raise ConfigError(f"corpus directory {str(root)!r} does not exist; give a directory "
                          "of .txt or .md files")  # fmt: skip
    files = sorted(p for p in root.rglob("*") if p.suffix in (".txt", ".md") and p.is_file())
    docs: list[Document] = []
    for i, file in enumerate(files[:MAX_USER_DOCUMENTS]):
        text = file.read_text(encoding="utf-8", errors="replace")[:MAX_USER_DOCUMENT_CHARS]
        title = next((line.strip() for line in text.splitlines() if line.strip()), file.stem)
        docs.append(Document(f"user:{i}", title[:200], text))
    return docs
