"""Griffe extensions for jaxdist's API reference (mkdocs.yml names them).

- `ExampleSections`: jaxdist's docstrings head their doctests `Example:` (as
  the Google style guide and Sphinx's napoleon accept); griffe parses only
  `Examples:` as code, and would render the singular as an admonition whose
  `>>>` lines are quotes.
- `ImportedOverModule`: `jaxdist.sync.diloco` is the function its package
  imports, not the module of the same name it shadows.
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
