"""Lambda: odd event shapes, through the handler and the real Mangum. Every field of a function URL event given a
wrong type (or removed): the answer is a 400 ``invalid_event`` in the error shape, or the app's own answer; the
handler never raises (a function error: 502 to the caller, and nothing in the API's error shape)."""

from __future__ import annotations

import base64
import copy
import json

import orjson
import pytest

from tests.adapters.conftest import invoke
from tests.adapters.contract import Reply
from tests.adapters.events import LambdaContext, function_url_event, http_api_event

#: what a field is replaced with: every JSON type, and a string JSON can carry that UTF-8 cannot
WRONG = {"null": None, "int": 5, "float": 1.5, "bool": True, "text": "text", "empty-text": "", "list": [],
         "int-list": [1], "object": {}, "int-object": {"a": 1}, "surrogate": "\ud800"}


def _event(make=function_url_event) -> dict:
    return make("POST", "/v1/embeddings", orjson.dumps({"input": ["hello"]}), query="a=1")


def _fields(value, path=()) -> list[tuple]:
    """Every field path of ``value`` (objects walked into), with ``cookies`` added (the event has none)."""
    found = []
    for key, inner in value.items():
        found.append((*path, key))
        if isinstance(inner, dict):
            found.extend(_fields(inner, (*path, key)))
    return found


FIELDS = [*_fields(_event()), ("cookies",)]


def _with(event: dict, path: tuple, value, *, drop: bool = False) -> dict:
    event = copy.deepcopy(event)
    holder = event
    for key in path[:-1]:
        holder = holder[key]
    if drop:
        holder.pop(path[-1], None)
    else:
        holder[path[-1]] = value
    return event


def _answer(module, event: dict) -> Reply:
    """The handler's answer as the runtime client writes it (its own encoder), read back."""
    from awslambdaric.lambda_runtime_marshaller import Encoder

    sent = json.loads(Encoder().encode(module.handler(event, LambdaContext())))
    assert isinstance(sent["statusCode"], int) and isinstance(sent.get("body", ""), str), sent
    body = sent.get("body") or ""
    raw = base64.b64decode(body) if sent.get("isBase64Encoded") else body.encode()
    return Reply(sent["statusCode"], {k.lower(): v for k, v in (sent.get("headers") or {}).items()}, raw)


def _assert_served_or_refused(reply) -> None:
    assert reply.status < 500, (reply.status, reply.body)
    if reply.status >= 400:
        body = reply.json()
        assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}, body
        assert body["error"]["message"]


@pytest.mark.parametrize("kind", list(WRONG))
@pytest.mark.parametrize("path", FIELDS, ids=".".join)
def test_every_field_of_a_wrong_type_is_refused_or_served(lambda_module, path, kind):
    _assert_served_or_refused(_answer(lambda_module, _with(_event(), path, WRONG[kind])))


@pytest.mark.parametrize("path", FIELDS, ids=".".join)
def test_every_field_removed_is_refused_or_served(lambda_module, path):
    _assert_served_or_refused(_answer(lambda_module, _with(_event(), path, None, drop=True)))


def _headers(**values):
    return lambda e: e["headers"].update(values)


#: the shapes that raised inside Mangum (ValueError, KeyError, TypeError, AttributeError)
RAISED = {
    "x-forwarded-port that is not a port": _headers(**{"x-forwarded-port": "notaport"}),
    "x-forwarded-port in other digits": _headers(**{"x-forwarded-port": "\u0664\u0664\u0663\u00b2"}),
    "a host with two colons": _headers(host="a:b:c"),
    "a host whose port is not a number": _headers(host="example.com:https"),
    "requestContext without http": lambda e: e["requestContext"].pop("http"),
    "requestContext.http without method": lambda e: e["requestContext"]["http"].pop("method"),
    "cookies with a number": lambda e: e.update(cookies=[1]),
    "cookies that are an object": lambda e: e.update(cookies={"a": "b"}),
    "a rawQueryString of null": lambda e: e.update(rawQueryString=None),
    "headers of null": lambda e: e.update(headers=None),
    "a header name that is not UTF-8": _headers(**{"x-odd\ud800": "v"}),
    "a body that is not UTF-8": lambda e: e.update(body='{"input": "\ud800"}'),
}


@pytest.mark.parametrize("make", [function_url_event, http_api_event], ids=["function-url", "http-api"])
@pytest.mark.parametrize("name", list(RAISED))
def test_shapes_mangum_cannot_read_are_a_400_invalid_event(lambda_module, name, make):
    event = _event(make)
    RAISED[name](event)
    reply = _answer(lambda_module, event)
    assert reply.status == 400, (reply.status, reply.body)
    error = reply.json()["error"]
    assert error["code"] == "invalid_event" and error["type"] == "invalid_request_error", error
    assert "\n" not in error["message"] and error["message"].startswith("the event"), error
    assert invoke(lambda_module, _event(make)).status == 200


def test_the_well_formed_event_is_served(lambda_module):
    """The fuzzing's starting point is an event that serves (what the cases above change is the only change)."""
    reply = _answer(lambda_module, _event())
    assert reply.status == 200 and len(reply.json()["data"]) == 1


def test_rest_api_events_are_checked_too(lambda_module):
    """Payload format 1.0 (REST API): the request line at the top of the event, read by Mangum's other handler."""
    event = {"resource": "/{proxy+}", "path": "/v1/embeddings", "httpMethod": "POST",
             "headers": {"content-type": "application/json", "host": "x.execute-api.us-east-1.amazonaws.com"},
             "multiValueHeaders": None, "queryStringParameters": None, "multiValueQueryStringParameters": None,
             "requestContext": {"identity": {"sourceIp": "203.0.113.10"}, "stage": "prod"},
             "body": orjson.dumps({"input": ["hello"]}).decode(), "isBase64Encoded": False}
    assert _answer(lambda_module, event).status == 200
    for change in ({"httpMethod": None}, {"path": 5}, {"queryStringParameters": "a=1"},
                   {"multiValueQueryStringParameters": {"a": "1"}}, {"requestContext": {"identity": None}},
                   {"multiValueHeaders": {"x-forwarded-port": ["443", "443"]}}):
        reply = _answer(lambda_module, {**event, **change})
        assert reply.status == 400 and reply.json()["error"]["code"] == "invalid_event", (change, reply.body)
