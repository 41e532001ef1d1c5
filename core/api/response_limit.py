"""A platform's cap on the size of an answer (Lambda's invocation payload and SageMaker's InvokeEndpoint
response, 6 MB each), as an option of the app: ``create_app(response_limit=ResponseLimit(...))``.

Where the platform would fail the invocation with its own opaque error, the app answers a 413 in the error
shape (``response_too_large``) whose wording (``refusal``) names the platform's ways out:

- before any work, for an embeddings request whose JSON answer cannot fit whatever the model computes
  (inputs × dimension × bytes per value, counted low: ``core.api.embeddings.encode.least_embeddings_answer_bytes``),
  from the request the route has already parsed and validated (:func:`refuse_unfit_embeddings`: Lambda's
  requests; SageMaker checks a JSON Lines mini-batch's records together, before any of them runs);
- after the work, where the adapter measures what it sends (:meth:`ResponseLimit.refusal_for`): the bytes
  of SageMaker's answer, the JSON that Lambda's runtime client writes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from fastapi import Request

from core.api.asgi_call import in_process
from core.api.embeddings.encode import least_embeddings_answer_bytes
from core.errors import TooLarge

#: (size, the limit, what was asked: a route, "npy", "jsonlines"; whether the size is a lower bound) → the 413
Refusal = Callable[[int, int, str, bool], TooLarge]


@dataclass(frozen=True)
class ResponseLimit:
    max_bytes: int
    refusal: Refusal

    def refusal_for(self, size: int, *, least: bool = False, asked: str = "") -> TooLarge | None:
        """The 413 for an answer of ``size`` bytes (at least, with ``least``), or None when it fits."""
        return self.refusal(size, self.max_bytes, asked, least) if size > self.max_bytes else None


def response_limit_of(request: Request) -> ResponseLimit | None:
    return getattr(request.app.state, "response_limit", None)


def refuse_unfit_embeddings(request: Request, body: Any, max_items: int) -> None:
    """Raise the 413 for an embeddings request (``protocol.EmbeddingRequest``) whose JSON answer cannot fit the
    app's response limit, before any inference. Nothing to check without a limit, or for an in-process caller
    (``core.api.asgi_call``: SageMaker's ``/invocations``), which measures what it finally sends itself."""
    limit, registry = response_limit_of(request), request.app.state.registry
    if limit is None or registry is None or in_process(request.scope) is not None:
        return
    asked = {"input": body.input, "model": body.model, "modality": body.modality, "dimensions": body.dimensions,
             "embedding_type": body.embedding_type, "encoding_format": body.encoding_format}
    least = least_embeddings_answer_bytes(asked, registry, max_items)
    refusal = limit.refusal_for(least, least=True, asked="embeddings") if least is not None else None
    if refusal is not None:
        raise refusal
