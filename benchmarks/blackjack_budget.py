"""How many hands does Blackjack's signal need? Exact per-state value gaps against a hand budget.

A learner that sees only the state (``textgym/Blackjack-v1``) must tell, in every state, whether
hitting or sticking returns more, from returns of -1, 0 or +1. This script computes exactly
(infinite deck, Blackjack-v1's rules, ``sab``) for every state:

- ``Q(s, hit)`` and ``Q(s, stick)`` with basic strategy (the optimal policy) afterwards, and the
  standard deviation of each action's return (a learner that still plays worse afterwards
  estimates its own, often closer, values);
- how often a hand shows the state when both actions are played equally often (a learner that
  explores evenly; the chance of one visit per hand, as no state repeats within a hand);
- the returns per action that separate the two means by two standard errors,
  ``4 (σ_hit² + σ_stick²) / ΔQ²`` (a rule of thumb, not a bound: fewer returns often point
  the right way), and the hands that take at that visit rate.

Then, for each hand budget, the exact return of the table that plays basic strategy in every state
resolved within the budget and the fallback (``--fallback``: always stick, the embedded model's
starting point, or hit below 17) elsewhere. Any learner must pool what it learns across states to
do better than that table within the budget.

    python benchmarks/blackjack_budget.py --budgets 500,2000,6000,20000 [--fallback stick]
"""

from __future__ import annotations

import argparse
import itertools
from collections import defaultdict
from dataclasses import dataclass
from functools import cache

from textgym.envs.blackjack_exact import (
    CARDS,
    basic_strategy,
    expected_return,
    hand_total,
    states,
    stick_outcomes,
)

State = tuple[int, int, bool]
FALLBACKS = {
    "stick": lambda total, dealer, ace: "stick",
    "hit17": lambda total, dealer, ace: "hit" if total < 17 else "stick",
}


def _stick_moments(total: int, dealer: int, natural_hand: bool) -> tuple[float, float]:
    """(mean, mean square) of sticking on ``total`` against ``dealer``, over the hidden card."""
    mean = square = 0.0
    for hidden, p in CARDS.items():
        for outcome, q in stick_outcomes(total, dealer, hidden, natural_hand).items():
            mean, square = mean + p * q * outcome, square + p * q * outcome * outcome
    return mean, square


@cache
def _play_moments(raw: int, has_ace: bool, dealer: int) -> tuple[float, float]:
    """(mean, mean square) of the return from a hand (not a natural) played by basic strategy."""
    total, usable = hand_total(raw, has_ace)
    if basic_strategy(total, dealer, usable) == "stick":
        return _stick_moments(total, dealer, False)
    return _hit_moments(raw, has_ace, dealer)


def _hit_moments(raw: int, has_ace: bool, dealer: int) -> tuple[float, float]:
    mean = square = 0.0
    for card, p in CARDS.items():
        after = (raw + card, has_ace or card == 1)
        if hand_total(*after)[0] > 21:
            mean, square = mean - p, square + p
        else:
            m, s = _play_moments(*after, dealer)
            mean, square = mean + p * m, square + p * s
    return mean, square


@dataclass
class StateGap:
    """One state's action values (basic strategy afterwards) and how often it is shown."""

    state: State
    visit: float  # chance that a hand shows the state (the explorer of state_gaps)
    hit: tuple[float, float]  # (mean, standard deviation) of the return after hitting
    stick: tuple[float, float]
    hit_share: float = 0.5  # how often the explorer hits

    @property
    def gap(self) -> float:
        return abs(self.hit[0] - self.stick[0])

    @property
    def returns_needed(self) -> float:
        """Returns per action that separate the two means by two standard errors."""
        if self.gap == 0:
            return float("inf")
        return 4 * (self.hit[1] ** 2 + self.stick[1] ** 2) / self.gap**2

    @property
    def hands_needed(self) -> float:
        """Hands until each action has been played ``returns_needed`` times from the state."""
        rarer = min(self.hit_share, 1 - self.hit_share) * self.visit
        return self.returns_needed / rarer if rarer else float("inf")


def state_gaps(hit_share: float = 0.5) -> list[StateGap]:
    """Every state a hand can show, with its exact action values and visit chance.

    Args:
        hit_share: How often the explorer whose visits are counted hits (0: only the first
            turn's states are shown).
    """
    visits: dict[State, float] = defaultdict(float)
    sums: dict[State, list[float]] = defaultdict(lambda: [0.0] * 4)  # visit-weighted moments

    # Forward over the hands in order of their raw card sum (it grows with every hit): the
    # chance of each (raw, ace, natural) hand, then its share to the hands after a hit.
    for dealer, pd in CARDS.items():
        reach: dict[tuple[int, bool, bool], float] = defaultdict(float)
        for (first, p1), (second, p2) in itertools.product(CARDS.items(), repeat=2):
            hand = (first + second, 1 in (first, second), {first, second} == {1, 10})
            reach[hand] += pd * p1 * p2
        for raw in range(2, 22):
            for has_ace, natural_hand in itertools.product((False, True), repeat=2):
                p = reach.pop((raw, has_ace, natural_hand), 0.0)
                if p == 0:
                    continue
                total, usable = hand_total(raw, has_ace)
                state = (total, dealer, usable)
                visits[state] += p
                moments = (*_hit_moments(raw, has_ace, dealer),
                           *_stick_moments(total, dealer, natural_hand))  # fmt: skip
                for i, value in enumerate(moments):
                    sums[state][i] += p * value
                for card, q in CARDS.items():  # the explorer hits hit_share of the time
                    after = (raw + card, has_ace or card == 1)
                    if hit_share and hand_total(*after)[0] <= 21:
                        reach[(*after, False)] += p * hit_share * q
    gaps = []
    for state in states():
        p = visits.get(state, 0.0)
        if p == 0:
            continue
        hit_mean, hit_square, stick_mean, stick_square = (v / p for v in sums[state])
        gaps.append(
            StateGap(
                state,
                p,
                (hit_mean, max(hit_square - hit_mean**2, 0.0) ** 0.5),
                (stick_mean, max(stick_square - stick_mean**2, 0.0) ** 0.5),
                hit_share,
            )
        )
    return gaps


def budget_return(gaps: list[StateGap], hands: float, fallback: str) -> tuple[float, int]:
    """Exact return of basic strategy where resolved within ``hands``, ``fallback`` elsewhere."""
    resolved = {g.state for g in gaps if g.hands_needed <= hands}
    other = FALLBACKS[fallback]

    def decide(total: int, dealer: int, ace: bool) -> str:
        if (total, dealer, ace) in resolved:
            return basic_strategy(total, dealer, ace)
        return other(total, dealer, ace)

    return expected_return(decide), len(resolved)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budgets", default="500,1000,2000,6000,20000,100000")
    parser.add_argument("--fallback", choices=sorted(FALLBACKS), default="stick")
    parser.add_argument("--rows", type=int, default=12, help="states shown, by value at stake")
    args = parser.parse_args()
    gaps = state_gaps()
    print(f"{len(gaps)} states; return of the fallback alone ({args.fallback}): "
          f"{expected_return(FALLBACKS[args.fallback]):.4f}; basic strategy: "
          f"{expected_return(basic_strategy):.4f}")  # fmt: skip
    wrong = [g for g in gaps if FALLBACKS[args.fallback](*g.state) != basic_strategy(*g.state)]
    wrong.sort(key=lambda g: -g.visit * g.gap)
    print(f"\nStates where the fallback is wrong ({len(wrong)}), by value at stake "
          "(visit x gap), top rows:")  # fmt: skip
    print("| state (total, dealer, soft) | right | Q hit | Q stick | gap | visits per 1,000 hands "
          "| returns needed per action | hands needed |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|")
    for g in wrong[: args.rows]:
        print(f"| {g.state} | {basic_strategy(*g.state)} | {g.hit[0]:+.3f} | {g.stick[0]:+.3f} "
              f"| {g.gap:.3f} | {1000 * g.visit:.1f} | {g.returns_needed:,.0f} "
              f"| {g.hands_needed:,.0f} |")  # fmt: skip
    print("\n| hands | states resolved | exact return of that table |")
    print("|---|---|---|")
    for hands in (float(h) for h in args.budgets.split(",")):
        value, count = budget_return(gaps, hands, args.fallback)
        print(f"| {hands:,.0f} | {count} of {len(gaps)} | {value:.4f} |")


if __name__ == "__main__":
    main()
