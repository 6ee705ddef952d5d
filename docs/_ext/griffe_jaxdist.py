"""Griffe extensions for jaxdist's API reference (mkdocs.yml names them).

- `ExampleSections`: jaxdist's docstrings head their doctests `Example:` (as
  the Google style guide and Sphinx's napoleon accept); griffe parses only
  `Examples:` as code, and would render the singular as an admonition whose
  `>>>` lines are quotes.
- `ImportedOverModule`: `jaxdist.sync.diloco` is the function its package
  imports, not the module of the same name it shadows.
- `InheritedDocstrings`: a method without a docstring of its own shows the
  one it overrides (`TopK.encode` shows `Compressor.encode`'s), as Python's
  `inspect.getdoc` and `help` do; griffe would show none.
"""

import re

import griffe

_HEADING = re.compile(r'^(\s*)Example:\s*$', re.M)


class ExampleSections(griffe.Extension):
  """Renames each docstring's `Example:` heading to `Examples:` before it is parsed."""

  def on_instance(self, *, obj: griffe.Object, **kwargs) -> None:
    if obj.docstring is not None:
      obj.docstring.value = _HEADING.sub(r'\1Examples:', obj.docstring.value)


class ImportedOverModule(griffe.Extension):
  """A package's name is what `import` gives: a function its `__init__` imports, not the module.

  `jaxdist.sync.diloco` is the function `diloco` (the package imports it from
  its module `diloco.py`, which it shadows); griffe would list the module.
  """

  def on_package(self, *, pkg: griffe.Module, **kwargs) -> None:
    self._swap(pkg)

  def on_package_loaded(self, *, pkg: griffe.Module, **kwargs) -> None:  # griffe 1.x's name
    self._swap(pkg)

  def _swap(self, module: griffe.Module) -> None:
    for name, member in list(module.members.items()):
      if member.is_alias or not member.is_module:
        continue
      self._swap(member)
      target = member.members.get(name)
      if module.imports.get(name) == f'{member.path}.{name}' and target is not None:
        module.set_member(name, griffe.Alias(name, target, parent=module))


class InheritedDocstrings(griffe.Extension):
  """Gives each method without a docstring that of the first class in its MRO that has one.

  Only within the package: a base griffe cannot resolve (e.g. `flax.linen.Module`) gives
  nothing. The docstring's Args must then name the override's parameters, or the strict
  build fails on griffe's warning, as for any docstring.
  """

  def on_package(self, *, pkg: griffe.Module, **kwargs) -> None:
    self._inherit(pkg)

  def on_package_loaded(self, *, pkg: griffe.Module, **kwargs) -> None:  # griffe 1.x's name
    self._inherit(pkg)

  def _inherit(self, obj: griffe.Object) -> None:
    for member in obj.members.values():
      if not member.is_alias and (member.is_module or member.is_class):
        self._inherit(member)
    if not obj.is_class:
      return
    for name, member in obj.members.items():
      if member.is_alias or not member.is_function or member.docstring is not None:
        continue
      for base in obj.mro():
        found = base.members.get(name)
        if found is not None and not found.is_alias and found.docstring is not None:
          doc = found.docstring
          member.docstring = griffe.Docstring(
            doc.value, parent=member, parser=doc.parser, parser_options=doc.parser_options
          )
          break
