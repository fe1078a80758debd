"""The agents' API reference, generated from the installed DSLs (`mkb docs build`)."""

from mkb.docs.generate import BuildReport, build, build_dsl
from mkb.docs.entries import first_paragraph, signature_of

__all__ = ["BuildReport", "build", "build_dsl", "first_paragraph", "signature_of"]
