"""Local images that must not hang or crash the server (issue 11, faults 1 and 2).

A FIFO, a directory or a NUL byte given as a local image is a 400 naming the field, and a
text-only chat request never waits on the image path (it borrows no thread from trio's
default pool, which blocked image reads once exhausted).
"""

from __future__ import annotations

import os

import httpx
import pytest
import trio

from tests.contract.serving import fake, running
from tests.contract.test_images import URL_PARAM, ask, error_of, image_url, post
from waste.app import Settings


@pytest.fixture(scope="module")
def local_served():
    settings = Settings(fake_engine="builtin", vision=True, allow_local_images=True)
    with running(fake(vision=True), settings) as (base, app):
        yield base, app


@pytest.fixture
def local_client(local_served):
    # The timeout is a safety net for the old hang, not a speed check.
    with httpx.Client(base_url=local_served[0], timeout=10) as c:
        yield c


def test_a_fifo_is_refused_without_blocking(local_client, tmp_path):
    fifo = tmp_path / "pipe.png"
    os.mkfifo(fifo)
    err = error_of(post(local_client, ask(image_url(str(fifo)))))
    assert (err["code"], err["param"]) == ("invalid_image", URL_PARAM)
    assert "regular file" in err["message"]


def test_a_directory_is_refused(local_client, tmp_path):
    err = error_of(post(local_client, ask(image_url(str(tmp_path)))))
    assert (err["code"], err["param"]) == ("invalid_image", URL_PARAM)


@pytest.mark.parametrize("url", ["file:///tmp/x%00.png", "/tmp/x\x00.png"])
def test_a_nul_byte_in_a_local_path_is_a_400_naming_the_field(local_client, url):
    err = error_of(post(local_client, ask(image_url(url))))
    assert (err["code"], err["param"]) == ("invalid_image", URL_PARAM)
    assert "NUL" in err["message"]


def test_text_only_chat_borrows_no_thread_from_the_default_pool(local_served):
    """With every token of trio's default thread limiter taken (as 40 hung image reads did),
    a text-only chat request still answers."""
    base, app = local_served
    token = app.extensions["waste"].service.trio_token
    borrowed = object()

    async def take_all() -> int:
        limiter = trio.to_thread.current_default_thread_limiter()
        for _ in range(int(limiter.total_tokens)):
            limiter.acquire_on_behalf_of_nowait((borrowed, _))
        return int(limiter.total_tokens)

    async def give_back(n: int) -> None:
        limiter = trio.to_thread.current_default_thread_limiter()
        for i in range(n):
            limiter.release_on_behalf_of((borrowed, i))

    n = trio.from_thread.run(take_all, trio_token=token)
    try:
        with httpx.Client(base_url=base, timeout=10) as c:
            reply = c.post("/v1/chat/completions",
                           json={"messages": [{"role": "user", "content": "hi"}]})
        assert reply.status_code == 200, reply.text
    finally:
        trio.from_thread.run(give_back, n, trio_token=token)
