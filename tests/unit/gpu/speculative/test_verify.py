"""The accepted run: the guesses the samples agree with, up to the first disagreement."""

import pytest

from gpu.speculative.verify import accepted_run


def test_every_guess_agreeing_keeps_them_all() -> None:
    assert accepted_run([5, 6, 7], [5, 6, 7, 8]) == 3


def test_the_first_disagreement_ends_the_run() -> None:
    assert accepted_run([5, 6, 7], [5, 9, 7, 8]) == 1
    assert accepted_run([5, 6, 7], [1, 6, 7, 8]) == 0


def test_a_later_agreement_after_a_miss_counts_for_nothing() -> None:
    assert accepted_run([1, 2, 3, 4], [1, 0, 3, 4, 5]) == 1


def test_rows_must_be_one_more_than_guesses() -> None:
    with pytest.raises(ValueError, match="need 3 sampled rows"):
        accepted_run([1, 2], [1, 2])
