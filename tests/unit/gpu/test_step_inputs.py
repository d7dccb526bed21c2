"""`StepInputs`: a step's values staged in one host buffer come back bit for bit, as views."""

from __future__ import annotations

import torch

from gpu.step_inputs import StepInputs


def test_ints_rows_and_floats_come_back_as_staged() -> None:
    stage = StepInputs(torch.device("cpu"), capacity=8)
    stage.begin()
    ids = stage.put([5, 6, 7])
    rows = stage.put_rows([[1, 2], [3], []], width=3, pad=0)
    floats = stage.put_floats([0.5, -1.25, 1e-30])
    stage.send()
    assert stage.view(ids).tolist() == [5, 6, 7]
    assert stage.view(rows).view(3, 3).tolist() == [[1, 2, 0], [3, 0, 0], [0, 0, 0]]
    back = stage.view(floats)
    assert back.dtype == torch.float32
    assert back.tolist() == torch.tensor([0.5, -1.25, 1e-30], dtype=torch.float32).tolist()


def test_growing_keeps_what_was_staged_earlier_in_the_step() -> None:
    stage = StepInputs(torch.device("cpu"), capacity=4)
    stage.begin()
    first = stage.put([1, 2, 3])
    second = stage.put(list(range(100)))  # past the capacity: the buffer doubles (and more)
    stage.send()
    assert stage.capacity >= 103
    assert stage.view(first).tolist() == [1, 2, 3]
    assert stage.view(second).tolist() == list(range(100))


def test_a_new_step_reuses_the_buffer_from_its_start() -> None:
    stage = StepInputs(torch.device("cpu"), capacity=16)
    stage.begin()
    a = stage.put([9, 9])
    stage.begin()
    b = stage.put([4])
    assert a.offset == b.offset == 0


def test_on_the_cpu_the_host_buffer_is_the_device_buffer() -> None:
    stage = StepInputs(torch.device("cpu"))
    assert stage.buffer is stage.host  # no copy at all
    assert not stage.host.is_pinned()
