"""Typed workflow parameters: one declaration gives the Argo UI form and the input validation.

Argo parameters are strings with an optional ``enum``. Each :class:`PipelineParameter` also
carries a type and bounds; :func:`type_annotation` renders those into the workflow annotation
``sublimate.dev/parameter-types``, which the local runner and ``sublimate submit`` check before a
run starts (Argo itself ignores it).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from sublimate.pipelines.argo_terms import TYPES_ANNOTATION

if TYPE_CHECKING:
    from hera.workflows import Parameter

    from sublimate.components.base.settings import Setting

__all__ = ["TYPES_ANNOTATION", "PipelineParameter", "describe_parameters", "type_annotation"]


@dataclass(frozen=True)
class PipelineParameter:
    name: str
    default: str | int | float
    description: str
    type: Literal["string", "integer", "number", "boolean"] = "string"
    enum: tuple[str, ...] = ()
    minimum: float | None = None
    maximum: float | None = None
    pattern: str | None = None  # a regular expression the whole value must match

    @classmethod
    def from_setting(cls, setting: Setting) -> PipelineParameter:
        """The pipeline parameter of a train-step setting (its one declaration)."""
        text = setting.auto_pattern  # "auto" or a number: text, by its pattern
        return cls(setting.name, setting.default_text(), setting.description,
                   type="string" if text else setting.kind,
                   # booleans are a true/false drop-down in the Argo UI
                   enum=("true", "false") if setting.kind == "boolean" else setting.choices,
                   minimum=None if text else setting.minimum,
                   maximum=None if text else setting.maximum,
                   pattern=text or setting.pattern)

    def to_hera(self) -> Parameter:
        from hera.workflows import Parameter

        return Parameter(name=self.name, value=str(self.default), description=self.description,
                         enum=list(self.enum) or None)

    def constraints(self) -> dict[str, object]:
        spec: dict[str, object] = {"type": self.type}
        if self.minimum is not None:
            spec["minimum"] = self.minimum
        if self.maximum is not None:
            spec["maximum"] = self.maximum
        if self.pattern is not None:
            spec["pattern"] = self.pattern
        return spec

    def reference(self) -> str:
        return f"{{{{workflow.parameters.{self.name}}}}}"


def type_annotation(parameters: list[PipelineParameter]) -> str:
    return json.dumps({p.name: p.constraints() for p in parameters
                       if p.type != "string" or p.pattern},
                      sort_keys=True, separators=(",", ":"))


def describe_parameters(parameters: list[PipelineParameter], width: int = 100) -> str:
    """``name (default): description`` per parameter, wrapped for a terminal."""
    import textwrap

    lines = []
    for p in parameters:
        choices = f" [{'|'.join(p.enum)}]" if p.enum else ""
        head = f"  {p.name} (default: {p.default if p.default != '' else 'none'}){choices}"
        lines.append(head)
        lines += textwrap.wrap(p.description, width=width, initial_indent=" " * 6,
                               subsequent_indent=" " * 6)
    return "\n".join(lines)
