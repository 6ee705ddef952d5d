"""Every public name documents its arguments (`Args:`) and what it returns (`Returns:`).

Public is what the API reference shows: each `::: module` of docs/api/*.md, read by griffe
with mkdocs.yml's extensions and filters, as mkdocstrings renders it: the module's members
the filters keep (no leading underscore), those a module imports only when its `__all__`
names them, not its submodules; and, in each class, its own members likewise, recursively.
Of these, every function, method and class is checked with griffe's Google parser:

- a function or method names each of its parameters (but `self` and `cls`) under `Args:`;
- a class names each parameter of its constructor (its `__init__`, or the fields of a
  dataclass, NamedTuple or Flax module) under `Args:` or `Attributes:`, in its own
  docstring or its `__init__`'s (mkdocs.yml merges the two);
- a function that returns something (its annotation is not `None`, or, without one, it has
  a `return` with a value) has a `Returns:` section, or `Yields:` if it yields.

Exempt: properties (documented as attributes), attributes and constants, and dunder
methods (the filters hide them; `__init__` is its class's). A method without a docstring
shows, and is checked by, the one it overrides (mkdocs.yml's `InheritedDocstrings`). Needs
griffe (the `docs` extra).
"""

import ast
import dataclasses
import functools
import os
import re
import textwrap

import pytest

from conftest import REPO

griffe = pytest.importorskip('griffe')
yaml = pytest.importorskip('yaml')  # MkDocs's, as griffe is mkdocstrings'

API_PAGES = os.path.join(REPO, 'docs', 'api')
# A class with no `__init__` of its own whose annotated class attributes are its constructor's
# parameters (a dataclass's come from griffe's dataclasses extension, as its `__init__`).
FIELDS_BASES = ('NamedTuple', 'nn.Module', 'linen.Module')


@dataclasses.dataclass(frozen=True)
class Options:
  """The python handler's options in mkdocs.yml that decide what is shown and how it parses."""

  filters: tuple[tuple[re.Pattern, bool], ...]
  extensions: tuple[str, ...]
  parser: dict  # docstring_options


@functools.cache
def options() -> Options:
  """mkdocs.yml's python handler options: its filters, griffe extensions and parser options."""
  with open(os.path.join(REPO, 'mkdocs.yml')) as f:
    config = yaml.safe_load(f)
  plugin = next(p['mkdocstrings'] for p in config['plugins'] if isinstance(p, dict))
  python = plugin['handlers']['python']['options']
  assert python['docstring_style'] == 'google'
  filters = tuple(
    (re.compile(f.removeprefix('!')), f.startswith('!')) for f in python.get('filters', [])
  )
  extensions = tuple(os.path.join(REPO, e) for e in python.get('extensions', []))
  return Options(filters, extensions, python.get('docstring_options', {}))


def shown_modules() -> list[str]:
  """The identifiers of the `::: module` blocks of docs/api/*.md, page by page."""
  found = []
  for page in sorted(os.listdir(API_PAGES)):
    with open(os.path.join(API_PAGES, page)) as f:
      found += re.findall(r'^::: ([\w.]+)\s*$', f.read(), re.M)
  return found


def load(modules: list[str], opts: Options):
  """The griffe tree of the package `modules` belong to, read as mkdocstrings reads it."""
  loader = griffe.GriffeLoader(
    extensions=griffe.load_extensions(*opts.extensions),
    search_paths=[REPO],
    docstring_parser=griffe.Parser.google,
  )
  for package in sorted({m.split('.')[0] for m in modules}):
    loader.load(package)
  loader.resolve_aliases(implicit=False, external=None)
  return loader.modules_collection


def _kept(name: str, filters) -> bool:
  """mkdocstrings' filter rule: the last pattern that matches decides."""
  keep = None
  for regex, exclude in filters:
    if regex.search(name):
      keep = not exclude
  return keep if keep is not None else {e for _, e in filters} != {False}


def members(obj, filters):
  """`obj`'s members that its page shows, as (name, object) pairs; aliases resolved."""
  for name, member in obj.members.items():
    if not _kept(name, filters) or member.inherited:
      continue
    if member.is_alias and not member.is_public:  # an import its `__all__` does not name
      continue
    target = member.final_target if member.is_alias else member
    if target.is_module:  # show_submodules: false
      continue
    yield name, target


def public_objects(modules: list[str], opts: Options) -> dict[str, object]:
  """Each function and class the API reference shows, by the path it is shown under."""
  collection = load(modules, opts)
  shown, seen = {}, set()

  def walk(path, obj):
    for name, target in members(obj, opts.filters):
      if target.path in seen or not (target.is_function or target.is_class):
        continue
      seen.add(target.path)
      shown[f'{path}.{name}'] = target
      if target.is_class:
        walk(f'{path}.{name}', target)

  for module in modules:
    walk(module, collection[module])
  return shown


def _sections(docstring) -> dict[str, set[str]]:
  """The kinds of sections of a parsed docstring, each with the names it documents."""
  found: dict[str, set[str]] = {}
  for section in docstring.parse(griffe.Parser.google, **options().parser) if docstring else ():
    names = found.setdefault(section.kind.value, set())
    if section.kind.value in ('parameters', 'other parameters', 'attributes'):
      names.update(item.name.lstrip('*') for item in section.value)
  return found


def _own_statements(node: ast.AST):
  """The statements and expressions of a function, not those of functions or classes in it."""
  for child in ast.iter_child_nodes(node):
    if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef | ast.Lambda):
      continue
    yield child
    yield from _own_statements(child)


def returns(function) -> str | None:
  """'returns', 'yields' or None: what `function`'s docstring has to say it gives back."""
  tree = ast.parse(textwrap.dedent(function.source))
  body = list(_own_statements(tree.body[0]))
  if any(isinstance(n, ast.Yield | ast.YieldFrom) for n in body):
    return 'yields'
  if function.returns is not None:
    return None if str(function.returns) in ('None', 'NoReturn', 'Never') else 'returns'
  return 'returns' if any(isinstance(n, ast.Return) and n.value for n in body) else None


def constructor_parameters(cls) -> list[str]:
  """The parameters of `cls(...)`: its `__init__`'s, or the fields of its kind of dataclass."""
  names = [p.name for p in cls.parameters if p.name not in ('self', 'cls')]
  if names or not any(str(b).endswith(FIELDS_BASES) for b in cls.bases):
    return names
  return [
    name
    for name, member in cls.members.items()
    if not member.is_alias
    and member.is_attribute
    and member.annotation is not None
    and 'property' not in member.labels
    and not str(member.annotation).startswith(('ClassVar', 'typing.ClassVar'))
    and not name.startswith('_')
  ]


def problems(obj) -> list[str]:
  """What `obj`'s docstring lacks: undocumented arguments, a missing Returns section."""
  found = []
  if obj.is_class:
    init = obj.members.get('__init__')
    sections = _sections(obj.docstring)
    for kind, names in _sections(init.docstring if init is not None else None).items():
      sections.setdefault(kind, set()).update(names)
    documented = sections.get('parameters', set()) | sections.get('attributes', set())
    missing = [p for p in constructor_parameters(obj) if p not in documented]
    if missing:
      found.append(f'Args or Attributes lack {", ".join(missing)}')
    return found
  if 'property' in obj.labels or 'cached_property' in obj.labels:
    return found
  sections = _sections(obj.docstring)
  documented = sections.get('parameters', set()) | sections.get('other parameters', set())
  names = [p.name for p in obj.parameters if p.name not in ('self', 'cls')]
  missing = [name for name in names if name not in documented]
  if missing:
    found.append(f'Args lacks {", ".join(missing)}')
  gives = returns(obj)
  if gives == 'returns' and 'returns' not in sections:
    found.append('no Returns section')
  if gives == 'yields' and not {'yields', 'returns'} & set(sections):
    found.append('no Yields section')
  return found


def offenders(shown: dict[str, object]) -> list[str]:
  return [f'{path}: {"; ".join(p)}' for path, obj in shown.items() if (p := problems(obj))]


def test_the_public_names_are_those_of_the_api_reference():
  shown = public_objects(shown_modules(), options())
  assert len(shown) > 400, len(shown)
  for name in ('all_finite', 'gradient_norm', 'mixing_matrix', 'stage_delays', 'local_sgd'):
    assert f'jaxdist.sync.{name}' in shown, name
  assert 'jaxdist.comm.Transfer' in shown
  assert not any('._' in path or path.endswith('.diloco.diloco') for path in shown)
  methods = [p for p in shown if p.startswith('jaxdist.testing.Run.')]
  assert methods, 'the methods of a shown class are shown'


def test_every_public_name_documents_its_args_and_returns():
  found = offenders(public_objects(shown_modules(), options()))
  assert not found, f'{len(found)} public names lack docs:\n' + '\n'.join(found)


FAKE = '''
from typing import NamedTuple

__all__ = ['documented', 'bare', 'Pair', 'Holder', 'gen']


def documented(x, *, y=1) -> int:
  """Adds.

  Args:
    x: a number.
    y: another.

  Returns:
    Their sum.
  """
  return x + y


def bare(x, y):
  """Adds, saying nothing of `x` or what comes back."""
  return x + y


def gen(n):
  """Counts to `n`.

  Args:
    n: how far.
  """
  yield from range(n)


def _private(x):
  return x


class Pair(NamedTuple):
  """Two things.

  Attributes:
    a: the first.
  """

  a: int
  b: int


class Holder:
  """Holds `value`.

  Args:
    value: what is held.
  """

  def __init__(self, value):
    self.value = value

  @property
  def twice(self):
    """Twice the value."""
    return 2 * self.value

  def get(self, default=None):
    """The value, or `default`."""
    return self.value or default
'''


def test_the_check_names_each_undocumented_argument_and_return():
  with griffe.temporary_visited_module(FAKE, docstring_parser=griffe.Parser.google) as module:
    shown = {}
    for name, obj in members(module, options().filters):
      shown[f'fake.{name}'] = obj
      if obj.is_class:
        shown.update({f'fake.{name}.{n}': m for n, m in members(obj, options().filters)})
    assert offenders({k: v for k, v in shown.items() if v.is_function or v.is_class}) == [
      'fake.bare: Args lacks x, y; no Returns section',
      'fake.gen: no Yields section',
      'fake.Pair: Args or Attributes lack b',
      'fake.Holder.get: Args lacks default; no Returns section',
    ]
