"""The translation server (``python -m transformer.serve``): its answers are the Translator's for
the same lines and options, requests sent at once each get their own (those that wait decoded
together where they can), and bad requests get a 400 naming the field."""

from __future__ import annotations

import http.client
import json
import re
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from tests.tiny import compose_cfg, script_env, tiny_overrides
from transformer import DecodeOptions, Translator
from transformer.errors import ConfigError, DataError, GuideError
from transformer.request_batches import Batcher, Job
from transformer.serve import MAX_BODY, TranslationServer, _Handler, main, parse_request
from transformer.training import train


@pytest.fixture(scope="module")
def lines(corpus) -> list[str]:
    """Four of the corpus's test sources and a blank line."""
    sources = (corpus / "test.en").read_text().splitlines()
    return [sources[0], "", *sources[1:4]]


@pytest.fixture(scope="module")
def checkpoint(corpus, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("run")
    train(compose_cfg([*tiny_overrides(corpus), "trainer.max_steps=40"], out))
    return out / "checkpoints" / "last.ckpt"


@pytest.fixture(scope="module")
def translator(checkpoint) -> Translator:
    return Translator.from_checkpoint(checkpoint, device="cpu")


@pytest.fixture(scope="module")
def url(translator, checkpoint) -> Iterator[str]:
    """A server of the tiny model on a free port, its defaults beam 3."""
    server = TranslationServer(("127.0.0.1", 0), translator, {"beam_size": 3}, [str(checkpoint)])
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def post(
    url: str, body: Any, path: str = "/translate", key: str | None = None
) -> tuple[int, dict[str, Any]]:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    headers = {"Content-Type": "application/json"}
    if key is not None:
        headers["Authorization"] = f"Bearer {key}"
    request = urllib.request.Request(url + path, data, headers)
    try:
        with urllib.request.urlopen(request, timeout=60) as answer:
            return answer.status, json.load(answer)
    except urllib.error.HTTPError as err:
        return err.code, json.load(err)


def expected(translator: Translator, lines: list[str], options: dict, **guides) -> list:
    found = translator.translate(lines, DecodeOptions(**options), **guides)
    return [[{"text": t.text, "score": t.score} for t in sentence] for sentence in found]


class Held:
    """The translator, its first call held until ``release`` is set; each call's lines kept."""

    def __init__(self, translator: Translator) -> None:
        self.translator, self.calls = translator, []
        self.busy, self.release = threading.Event(), threading.Event()

    def __getattr__(self, name: str) -> Any:  # the rest is the translator's (models, device)
        return getattr(self.translator, name)

    def translate(self, lines, options, max_tokens=4096, **guides):
        self.calls.append(list(lines))
        if len(self.calls) == 1:
            self.busy.set()
            self.release.wait(60)
        return self.translator.translate(lines, options, max_tokens, **guides)


def decode_while_held(translator: Translator, jobs: list[Job], batch_lines: int) -> Held:
    """``jobs[0]`` decoded first, held until the others wait in this order, then all of them."""
    held = Held(translator)
    batcher = Batcher(held, 4096, batch_lines)
    with ThreadPoolExecutor(len(jobs)) as pool:
        pool.submit(batcher.translate, jobs[0])
        assert held.busy.wait(60)
        for k, job in enumerate(jobs[1:], 1):
            pool.submit(batcher.translate, job)
            while len(batcher.waiting) < k:  # queued in this order
                time.sleep(0.001)
        held.release.set()
    batcher.close()
    return held


def assert_as_alone(translator: Translator, job: Job) -> None:
    """The job's answer is the one it gets decoded by itself: the same texts, scores within
    float32's rounding (other lines share its batches)."""
    alone = translator.translate(
        job.lines, job.options, constraints=job.constraints, prefixes=job.prefixes
    )
    answer = job.answer.result(timeout=0)
    assert [[t.text for t in s] for s in answer] == [[t.text for t in s] for s in alone]
    assert [[t.constraints_met for t in s] for s in answer] == [
        [t.constraints_met for t in s] for s in alone
    ]
    scores = [t.score for s in answer for t in s if t.score is not None]
    assert scores == pytest.approx([t.score for s in alone for t in s if t.score is not None],
                                   abs=1e-5)  # fmt: skip


@pytest.mark.slow
def test_waiting_requests_are_decoded_together_each_as_it_would_be_alone(translator, lines):
    beam, nbest = DecodeOptions(beam_size=3), DecodeOptions(beam_size=3, nbest=2)
    sample = DecodeOptions(strategy="sample", seed=1)
    jobs = [
        Job(lines[:1], beam),  # decoding while the others arrive
        Job(lines[1:3], beam),
        Job(lines[:2], nbest),  # other options: a call of its own
        Job(lines[3:], beam),  # joins the second: 4 lines
        Job(lines, beam),  # 5 more would make 9, over 6
        Job(lines[2:4], sample),  # sampling: alone, each line's draws its own
        Job(lines[2:4], sample),
        Job(lines[1:3], beam, prefixes=["", lines[2].split()[0]]),  # joins the second: 6
        Job(lines[:1], beam, constraints=[[]]),  # constraints: not with None
    ]
    held = decode_while_held(translator, jobs, batch_lines=6)
    batcher = Batcher(translator)
    with pytest.raises(ValueError, match="this Job was sent before"):
        batcher.translate(jobs[1])  # its future holds its answer
    batcher.close()
    assert held.calls == [
        lines[:1], lines[1:3] + lines[3:] + lines[1:3], lines[:2], lines, lines[2:4], lines[2:4],
        lines[:1],
    ]  # fmt: skip
    for job in jobs:
        assert_as_alone(translator, job)
    assert jobs[5].answer.result() == jobs[6].answer.result()


def test_a_job_has_one_prefix_and_one_list_of_constraints_a_line():
    beam = DecodeOptions()
    with pytest.raises(DataError, match=re.escape("3 prefixes for 2 lines: give one a line")):
        Job(["a", "b"], beam, prefixes=["x", "", "y"])  # joined, "y" would be the next job's
    with pytest.raises(DataError, match=re.escape("1 lists of constraints for 2 lines")):
        Job(["a", "b"], beam, constraints=[["x"]])
    assert Job(["a", "b"], beam, prefixes=["x", ""], constraints=[[], ["y"]]).lines == ["a", "b"]


@pytest.mark.slow
def test_a_bad_request_decoded_with_others_fails_alone(translator, lines, corpus):
    word = (corpus / "test.de").read_text().split()[1]
    jobs = [
        Job(lines[:1], DecodeOptions(beam_size=3)),
        *(Job(lines[2:4], DecodeOptions(beam_size=3), constraints=c)
          for c in ([[word], []], [[], ["\u2603\u2603"]], [[], [word]])),
    ]  # fmt: skip
    held = decode_while_held(translator, jobs, batch_lines=64)
    assert held.calls == [lines[:1], lines[2:4] * 3, lines[2:4], lines[2:4], lines[2:4]]
    with pytest.raises(GuideError, match="^line 2: constraint '\u2603\u2603'"):
        jobs[2].answer.result(timeout=0)  # its own line number, not the merged call's 4
    for job in (jobs[0], jobs[1], jobs[3]):
        assert_as_alone(translator, job)


def test_a_request_is_checked_field_by_field():
    lines, options, prefixes, constraints = parse_request(
        b'{"text": "one line", "options": {"nbest": 2}}', {"beam_size": 3}
    )
    assert lines == ["one line"] and (options.beam_size, options.nbest) == (3, 2)
    assert prefixes is None and constraints is None
    refused = [
        (b"not json", DataError, "not JSON"),
        (b'["a line"]', DataError, '"text"'),
        (b'{"text": ["a"], "lines": 1}', DataError, "unknown field lines"),
        (b'{"text": ["a", 3]}', DataError, "text must be a list of strings"),
        (b'{"text": ["a\\nb"]}', DataError, "text[0] holds a line break"),
        (b'{"text": ["a"], "options": {"beam_size": 0}}', ConfigError, "options.beam_size"),
        (b'{"text": ["a"], "options": {"beams": 2}}', ConfigError, "unknown option options.beams"),
        (b'{"text": ["a"], "constraints": ["x"]}', DataError, "constraints[0] must be a list"),
    ]
    for body, kind, message in refused:
        with pytest.raises(kind, match=re.escape(message)):
            parse_request(body, {})


@pytest.mark.slow
@pytest.mark.parametrize("options", [{}, {"strategy": "greedy"}, {"nbest": 2}])
def test_answers_are_the_translators(url, translator, lines, options):
    status, answer = post(url, {"text": lines, "options": options})
    assert status == 200
    assert answer["translations"] == expected(translator, lines, {"beam_size": 3, **options})
    assert answer["translations"][1] == [{"text": "", "score": None}]  # the blank line


@pytest.mark.slow
def test_requests_sent_at_once_each_get_their_own(url, translator, lines):
    requests = [lines[i:] + lines[:i] for i in range(len(lines))] * 2
    with ThreadPoolExecutor(len(requests)) as pool:
        answers = list(pool.map(lambda sent: post(url, {"text": sent}), requests))
    for sent, (status, answer) in zip(requests, answers, strict=True):
        assert status == 200
        assert answer["translations"] == expected(translator, sent, {"beam_size": 3})


@pytest.mark.slow
def test_prefixes_and_constraints(url, translator, corpus):
    lines = (corpus / "test.en").read_text().splitlines()[:2]
    references = (corpus / "test.de").read_text().splitlines()[:2]
    prefixes = [references[0].split()[0], ""]
    status, answer = post(url, {"text": lines, "prefixes": prefixes})
    assert status == 200
    assert answer["translations"] == expected(translator, lines, {"beam_size": 3},
                                              prefixes=prefixes)  # fmt: skip
    assert answer["translations"][0][0]["text"].startswith(prefixes[0])
    constraints = [[], [references[1].split()[-1]]]
    status, answer = post(url, {"text": lines, "constraints": constraints})
    assert status == 200
    found = translator.translate(lines, DecodeOptions(beam_size=3), constraints=constraints)
    assert [[(t["text"], t["constraints_met"]) for t in s] for s in answer["translations"]] == [
        [(t.text, t.constraints_met) for t in s] for s in found
    ]
    assert answer["translations"][1][0]["constraints_met"] is True


@pytest.mark.slow
def test_bad_requests_get_400_naming_the_field_and_the_server_goes_on(url, checkpoint):
    assert post(url, {"text": ["a"], "options": {"beam_size": -1}}) == (
        400, {"error": "options.beam_size must be >= 1, got -1"}
    )  # fmt: skip
    status, answer = post(url, {"text": ["a"], "constraints": [["a"]],
                                "options": {"strategy": "greedy"}})  # fmt: skip
    assert status == 400 and "constraints need beam search" in answer["error"]
    status, answer = post(url, {"text": ["a"], "constraints": [["\u2603\u2603"]]})
    assert status == 400 and "line 1: constraint" in answer["error"]
    status, answer = post(url, {"text": ["a", "b"], "prefixes": ["x"]})
    assert status == 400 and "1 prefixes for 2 lines" in answer["error"]
    status, answer = post(url, {"text": ["a", "b"], "constraints": [["x"]]})
    assert status == 400 and "1 lists of constraints for 2 lines" in answer["error"]
    assert post(url, b"{", "/nowhere")[0] == 404
    with urllib.request.urlopen(url + "/health", timeout=10) as answer:
        health = json.load(answer)
    assert health["checkpoints"] == [str(checkpoint)] and health["options"] == {"beam_size": 3}
    assert (health["models"], health["device"], health["dtype"]) == (1, "cpu", "float32")
    assert (health["max_tokens"], health["batch_lines"]) == (4096, 64)
    assert post(url, {"text": ["a"]})[0] == 200


@pytest.mark.slow
def test_closing_the_server_answers_the_requests_it_has_read(translator, lines, monkeypatch):
    monkeypatch.setattr(_Handler, "timeout", 0.5)  # seconds a kept-alive connection idles
    writing, answer_now = threading.Event(), _Handler._answer
    monkeypatch.setattr(_Handler, "_answer", lambda *a: writing.wait(60) and answer_now(*a))
    held = Held(translator)
    server = TranslationServer(("127.0.0.1", 0), held, {"beam_size": 3})
    serving = threading.Thread(target=server.serve_forever, daemon=True)
    serving.start()
    connection = http.client.HTTPConnection(*server.server_address[:2], timeout=60)
    connection.request("POST", "/translate", json.dumps({"text": lines}))  # held while decoded
    assert held.busy.wait(60)
    server.shutdown()  # the service stops: no more connections ...
    closing = threading.Thread(target=server.server_close)
    closing.start()
    closing.join(0.5)
    assert closing.is_alive()  # ... but the request it has read is still being answered
    held.release.set()
    closing.join(0.5)
    assert closing.is_alive()  # ... and written
    writing.set()
    answer = connection.getresponse()  # the connection is kept open: closed after its idle time
    assert answer.status == 200
    assert json.load(answer)["translations"] == expected(translator, lines, {"beam_size": 3})
    closing.join(30)
    assert not closing.is_alive()
    connection.close()
    with pytest.raises(urllib.error.URLError, match="Connection refused"):
        post(f"http://127.0.0.1:{server.server_address[1]}", {"text": lines})


@pytest.mark.slow
def test_with_an_api_key_translating_needs_it(translator, lines):
    server = TranslationServer(("127.0.0.1", 0), translator, {"beam_size": 3}, api_key="s3cret")
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        for key in (None, "wrong", "s3cre"):
            status, answer = post(url, {"text": lines}, key=key)
            assert status == 401 and "Authorization: Bearer KEY" in answer["error"]
        status, answer = post(url, {"text": lines}, key="s3cret")
        assert status == 200
        assert answer["translations"] == expected(translator, lines, {"beam_size": 3})
        with urllib.request.urlopen(url + "/health", timeout=10) as health:  # a probe: no key
            assert health.status == 200
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.slow
def test_a_connection_carries_several_requests_and_an_oversized_body_is_refused(url, lines):
    host, port = url.removeprefix("http://").split(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=60)
    for _ in range(2):  # keep-alive: both on one connection
        connection.request("POST", "/translate", json.dumps({"text": lines[:1]}))
        answer = connection.getresponse()
        assert answer.status == 200 and len(json.load(answer)["translations"]) == 1
    connection.close()
    connection = http.client.HTTPConnection(host, int(port), timeout=60)
    connection.putrequest("POST", "/translate")
    connection.putheader("Content-Length", str(MAX_BODY + 1))
    connection.endheaders()  # the body is never sent: the answer comes before it
    answer = connection.getresponse()
    assert answer.status == 413 and "send fewer lines a request" in json.load(answer)["error"]
    connection.close()


@pytest.mark.slow
def test_the_command_serves_until_stopped(checkpoint, translator, lines, tmp_path):
    command = [sys.executable, "-m", "transformer.serve", str(checkpoint), "--port", "0",
               "--device", "cpu", "--decode", '{"strategy": "greedy"}']  # fmt: skip
    env = {**script_env(tmp_path), "TRANSFORMER_SERVE_API_KEY": "from-the-environment"}
    process = subprocess.Popen(command, env=env, stderr=subprocess.PIPE, text=True)
    try:
        for line in process.stderr:
            if found := re.search(r"on (http://[\d.]+:\d+)", line):
                break
        else:
            pytest.fail("the server never said where it listens")
        assert post(found.group(1), {"text": lines})[0] == 401
        status, answer = post(found.group(1), {"text": lines}, key="from-the-environment")
        assert status == 200
        assert answer["translations"] == expected(translator, lines, {"strategy": "greedy"})
        process.terminate()  # SIGTERM, as a service manager stops it: a clean exit
        assert process.wait(timeout=30) == 0
        assert "stopped" in process.stderr.read()
    finally:
        process.kill()
        process.wait(timeout=30)


def test_the_command_refuses_bad_options_by_name(tmp_path, capsys):
    missing = tmp_path / "nowhere" / "*.ckpt"
    for argv, message in (
        ([str(missing)], f"checkpoints={missing} matches no file"),
        (["x.ckpt", "--decode", "[1]"], "--decode='[1]' is not a JSON object"),
        (["x.ckpt", "--decode", '{"beam_size": 0}'], "--decode.beam_size must be >= 1"),
        (["x.ckpt", "--max-tokens", "0"], "--max-tokens must be >= 1"),
        (["x.ckpt", "--batch-lines", "0"], "--batch-lines must be >= 1"),
    ):
        with pytest.raises(SystemExit) as stop:
            main(argv)
        assert stop.value.code == 2 and message in capsys.readouterr().err


@pytest.mark.slow
def test_the_command_refuses_a_port_in_use(checkpoint, capsys):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        with pytest.raises(SystemExit) as stop:
            main([str(checkpoint), "--port", port, "--device", "cpu"])
    assert stop.value.code == 2
    assert f"cannot listen on 127.0.0.1:{port}" in capsys.readouterr().err
