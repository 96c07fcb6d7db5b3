"""moto without its dashboard's memory: what both of the runtime's processes patch."""

import functools
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from typing import Any
from unittest import mock


def _untracked(cls: type, *args: Any, **kwargs: Any) -> Any:
    return object.__new__(cls)


@contextmanager
def no_model_history() -> Iterator[None]:
    """moto records every model object in a class list for its dashboard (an Item for each
    copy an UpdateItem makes), a list that only grows; here none is kept. moto also looks
    up a handler's methods once per class, rather than on every request."""
    from moto.core import responses
    from moto.core.common_models import BaseModel

    cached = functools.cache(responses.method_names_from_class)
    with ExitStack() as patches:
        patches.enter_context(mock.patch.object(BaseModel, "__new__", _untracked))
        patches.enter_context(mock.patch.object(responses, "method_names_from_class", cached))
        yield
