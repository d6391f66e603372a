"""`Classifier.close` with a thread still using the client: over HTTP each thread's geventhttpclient connection is its
own, and closing it from another thread under a request in flight crashed the process (SIGSEGV: Ctrl-C in
`hub-vit classify` closed the client while its workers waited for answers). No server is needed: nothing is sent."""

from __future__ import annotations

import threading

import pytest

from hub_vit.server.client.classifier import Classifier
from hub_vit.server.client.errors import ClientClosed


class Connection:
    """Stands in for a thread's tritonclient HTTP client: records the threads that closed it."""

    def __init__(self) -> None:
        self.closed_by: list[threading.Thread] = []

    def close(self) -> None:
        self.closed_by.append(threading.current_thread())


def test_close_leaves_a_running_threads_connection_to_that_thread() -> None:
    client = Classifier("127.0.0.1:9")  # nothing listens: the first client connects lazily
    connection = Connection()
    client._connect = lambda: connection  # noqa: SLF001  (the worker's own client, made at its first call)
    holding, closed, result = threading.Event(), threading.Event(), {}

    def worker() -> None:  # a request in flight: the thread holds its connection while another closes the client
        assert client.client is connection
        holding.set()
        closed.wait(10)
        result["seen_closed_by"] = list(connection.closed_by)
        try:
            client.client  # noqa: B018  (its next call: the connection is closed here, in its own thread)
        except ClientClosed as err:
            result["error"] = err

    thread = threading.Thread(target=worker)
    thread.start()
    assert holding.wait(10)
    client.close()
    closed.set()
    thread.join(10)
    assert result["seen_closed_by"] == [], "close() closed another running thread's connection"
    assert isinstance(result.get("error"), ClientClosed)
    assert connection.closed_by == [thread], connection.closed_by


def test_close_closes_an_ended_threads_connection() -> None:
    client = Classifier("127.0.0.1:9")
    connection = Connection()
    client._connect = lambda: connection  # noqa: SLF001
    thread = threading.Thread(target=lambda: client.client)
    thread.start()
    thread.join(10)
    client.close()
    assert connection.closed_by and connection.closed_by[0] is threading.current_thread()
    with pytest.raises(ClientClosed):
        client.client  # noqa: B018
