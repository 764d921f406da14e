"""Rental offers: what a provider charges for a GPU machine, loaded from versioned CSV/TOML files.

An `Offer` is one machine shape at one provider and region, with an hourly price per billing mode (on-demand,
spot, weekly or monthly reserved), its storage, egress and snapshot prices, its billing unit, and where the
figures come from (`source`, `as_of`). The bundled catalog `offers.csv` is seeded from
shared/data/gpu_prices.csv (rules in docs/plan.md); users add or override rows with `--offers FILE` or an
`offers.toml`/`offers.csv` in the rentwise config dir ($RENTWISE_CONFIG_DIR, else the platform's config
folder, as for the GPU catalog). A row with the same `id` as a bundled one replaces it. Validation names
the file, the row and the field, and lists every problem at once.

Prices stay in the currency they were quoted in; `Currency` converts them for display and ranking.
"""

from __future__ import annotations

import csv
import math
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from importlib import resources
from pathlib import Path
from typing import Any, Literal, Protocol, get_args

from rentwise.errors import ConfigError, NotFoundError, did_you_mean

Billing = Literal["on_demand", "spot", "weekly", "monthly"]
BILLINGS: tuple[str, ...] = get_args(Billing)
BILLING_LABELS: dict[str, str] = {
    "on_demand": "on-demand",
    "spot": "spot",
    "weekly": "weekly",
    "monthly": "monthly",
}
# An average Gregorian month: 365.25 days × 24 h / 12 = 730.5 h (monthly terms, snapshots, rent vs buy).
HOURS_PER_MONTH = 365.25 * 24 / 12
# Hours a reserved term commits to: a week, and an average month.
RESERVED_TERM_H: dict[str, float] = {"weekly": 7 * 24.0, "monthly": HOURS_PER_MONTH}

Interconnect = Literal["nvlink", "pcie", ""]
NAMED_INSTANCES = frozenset({"AWS", "GCP", "Azure", "Alibaba Cloud", "Tencent Cloud"})

# Units of one US dollar, per currency. The CNY rate is the one the bundled Alibaba/Tencent rows were
# converted with in their source (sugarlxn/skypilot-catalog fetch workflow, --cny-usd-rate 0.138), so
# converting them back gives the quoted CNY price. Override with `--fx CNY=7.1` (units per USD).
DEFAULT_UNITS_PER_USD: dict[str, float] = {"USD": 1.0, "CNY": 1 / 0.138}

FIELDS: tuple[str, ...] = (
    "id", "provider", "region", "instance_type", "gpu", "gpu_count", "interconnect", "vcpus", "ram_gb",
    "currency", "on_demand_per_hour", "spot_per_hour", "weekly_per_hour", "monthly_per_hour",
    "billing_unit_s",
    "storage_per_gb_day", "storage_bills_stopped", "egress_per_gb", "snapshot_per_gb_month", "spot_mtbi_h",
    "source", "as_of", "notes",
)  # fmt: skip
REQUIRED: tuple[str, ...] = ("id", "provider", "gpu", "gpu_count", "currency", "source")


@dataclass(frozen=True)
class Offer:
    """One rentable machine shape. Prices: per hour, whole machine, in `currency`; None = not offered."""

    id: str
    provider: str
    region: str
    gpu: str
    gpu_count: int
    currency: str
    source: str
    instance_type: str = ""
    interconnect: Interconnect = ""
    """How the GPUs talk: 'nvlink', 'pcie', or '' to use the GPU's own spec."""
    vcpus: int | None = None
    ram_gb: float | None = None
    on_demand_per_hour: float | None = None
    spot_per_hour: float | None = None
    weekly_per_hour: float | None = None
    """Hourly rate of a one-week reservation (you pay whole weeks)."""
    monthly_per_hour: float | None = None
    """Hourly rate of a one-month reservation (you pay whole months of 730.5 h)."""
    billing_unit_s: int | None = None
    """Smallest billed time slice (1 = per second, 3600 = hourly); None = not known, planned as hourly."""
    storage_per_gb_day: float | None = None
    storage_bills_stopped: bool | None = None
    egress_per_gb: float | None = None
    snapshot_per_gb_month: float | None = None
    spot_mtbi_h: float | None = None
    """Mean time between spot interruptions for this offer, hours; None = use the planner's default."""
    as_of: str = ""
    notes: str = ""

    def price_per_hour(self, billing: str) -> float | None:
        """Hourly price of the whole machine under `billing`, or None when not offered."""
        return getattr(self, f"{billing}_per_hour")  # type: ignore[no-any-return]

    def billings(self) -> tuple[Billing, ...]:
        """The billing modes this offer has a price for."""
        return tuple(b for b in get_args(Billing) if self.price_per_hour(b) is not None)

    @property
    def label(self) -> str:
        """'AWS us-east-2 p5e.48xlarge 8xH200 SXM': provider, region, cloud instance type, GPUs."""
        where = f" {self.region}" if self.region and not self.region.startswith("(") else ""
        # Cloud instance names tell two shapes in one region apart (p5e vs p5en); marketplace ones are noise.
        machine = f" {self.instance_type}" if self.provider in NAMED_INSTANCES and self.instance_type else ""
        return f"{self.provider}{where}{machine} {self.gpu_count}x{self.gpu}"


class PriceSource(Protocol):
    """Anything that can list offers: the bundled catalog, a user file, a fake in tests, a live API later."""

    def offers(self) -> Sequence[Offer]: ...


@dataclass(frozen=True)
class StaticPriceSource:
    """A fixed list of offers (tests, the web form, merged catalogs)."""

    items: tuple[Offer, ...]

    def offers(self) -> Sequence[Offer]:
        return self.items


@dataclass(frozen=True)
class Currency:
    """Converts prices between currencies with fixed rates (units of each currency per US dollar)."""

    code: str = "USD"
    units_per_usd: Mapping[str, float] | None = None

    def __post_init__(self) -> None:
        rates = dict(DEFAULT_UNITS_PER_USD)
        rates.update(self.units_per_usd or {})
        object.__setattr__(self, "units_per_usd", rates)
        self.check(self.code)

    @property
    def rates(self) -> Mapping[str, float]:
        assert self.units_per_usd is not None
        return self.units_per_usd

    def check(self, code: str) -> None:
        """Raise `ConfigError` when `code` has no exchange rate."""
        if code not in self.rates:
            raise ConfigError(
                f"unknown currency '{code}'{did_you_mean(code, self.rates)}",
                hint=f"known: {', '.join(sorted(self.rates))}; add a rate with --fx {code}=UNITS_PER_USD",
            )

    def convert(self, amount: float, from_code: str) -> float:
        """`amount` in `from_code`, expressed in this currency."""
        self.check(from_code)
        return amount / self.rates[from_code] * self.rates[self.code]


def parse_fx(specs: Iterable[str]) -> dict[str, float]:
    """Parse ['CNY=7.1', ...] (units per US dollar) into a rates dict; raise `ConfigError` on bad text."""
    rates: dict[str, float] = {}
    for spec in specs:
        code, _, value = spec.partition("=")
        try:
            rate = float(value)
        except ValueError:
            rate = -1.0
        if not code.strip() or rate <= 0:
            raise ConfigError(
                f"cannot read exchange rate '{spec}'", hint="write it as CODE=UNITS_PER_USD, e.g. CNY=7.1"
            )
        rates[code.strip().upper()] = rate
    return rates


# --- parsing and validation ---------------------------------------------------------------------------------
_FLOATS = (
    "ram_gb", "on_demand_per_hour", "spot_per_hour", "weekly_per_hour", "monthly_per_hour",
    "storage_per_gb_day", "egress_per_gb", "snapshot_per_gb_month", "spot_mtbi_h",
)  # fmt: skip
_INTS = ("gpu_count", "vcpus", "billing_unit_s")
# Prices may be 0 (free egress or storage is common; an hourly price of 0 is a machine you already pay for
# elsewhere). Sizes and times between interruptions must be above 0: a zero there is a typo, not a fact.
_POSITIVE_FLOATS = ("ram_gb", "spot_mtbi_h")
_TRUE = ("1", "true", "yes", "y")
_FALSE = ("0", "false", "no", "n")


def _text(value: Any) -> str:
    return "" if value is None else str(value).strip()


def _parse_number(field: str, raw: Any, problems: list[str], integer: bool) -> float | int | None:
    text = _text(raw)
    if text == "":
        return None
    try:
        number: float | int = int(text) if integer else float(text)
    except ValueError:
        problems.append(f"{field} '{text}' is not a {'whole ' if integer else ''}number")
        return None
    if not math.isfinite(number):
        problems.append(f"{field} must be a finite number, got {text}")
        return None
    must_be_positive = (integer and field != "vcpus") or field in _POSITIVE_FLOATS
    if number < 0 or (must_be_positive and number == 0):
        problems.append(f"{field} must be {'positive' if must_be_positive else '0 or more'}, got {text}")
        return None
    return number


def offer_from_row(row: Mapping[str, Any], known_currencies: Iterable[str]) -> tuple[Offer | None, list[str]]:
    """Build an `Offer` from one CSV/TOML row; return it (or None) and every problem found."""
    problems: list[str] = []
    if None in row:  # csv.DictReader files values beyond the header's columns under the key None
        extra = ", ".join(repr(_text(v)) for v in row[None])  # type: ignore[index]
        problems.append(f"more values than the header has columns (extra: {extra})")
    unknown = sorted(name for name in set(row) - set(FIELDS) - {""} if name is not None)
    if unknown:
        problems.append(f"unknown field(s) {', '.join(unknown)}{did_you_mean(unknown[0], FIELDS)}")
    for name in REQUIRED:
        if _text(row.get(name)) == "":
            problems.append(f"{name} is missing")
    values: dict[str, Any] = {}
    for name in _FLOATS:
        values[name] = _parse_number(name, row.get(name), problems, integer=False)
    for name in _INTS:
        values[name] = _parse_number(name, row.get(name), problems, integer=True)
    currency = _text(row.get("currency")).upper()
    if currency and currency not in known_currencies:
        problems.append(
            f"currency '{currency}' has no exchange rate{did_you_mean(currency, known_currencies)}"
            f" (add one with --fx {currency}=UNITS_PER_USD)"
        )
    interconnect = _text(row.get("interconnect")).lower()
    if interconnect not in get_args(Interconnect):
        problems.append(f"interconnect '{interconnect}' is not one of nvlink, pcie or blank")
    stopped_text = _text(row.get("storage_bills_stopped")).lower()
    if stopped_text and stopped_text not in _TRUE + _FALSE:
        problems.append(f"storage_bills_stopped '{stopped_text}' is not true or false")
    if not problems and not any(values[f"{b}_per_hour"] is not None for b in BILLINGS):
        problems.append("no price: fill at least one of on_demand_per_hour, spot_per_hour, weekly_per_hour, "
                        "monthly_per_hour")  # fmt: skip
    if problems:
        return None, problems
    offer = Offer(
        id=_text(row["id"]),
        provider=_text(row["provider"]),
        region=_text(row.get("region")),
        instance_type=_text(row.get("instance_type")),
        gpu=_text(row["gpu"]),
        currency=currency,
        interconnect=interconnect,  # type: ignore[arg-type]
        storage_bills_stopped=None if not stopped_text else stopped_text in _TRUE,
        source=_text(row["source"]),
        as_of=_text(row.get("as_of")),
        notes=_text(row.get("notes")),
        **values,
    )
    return offer, []


def parse_offers(
    rows: Iterable[tuple[str, Mapping[str, Any]]], origin: str, known_currencies: Iterable[str]
) -> list[Offer]:
    """Validate (row label, row) pairs of one file; raise one `ConfigError` naming every bad row and field."""
    currencies = tuple(known_currencies)
    offers: list[Offer] = []
    problems: list[str] = []
    seen: dict[str, str] = {}
    for label, row in rows:
        offer, row_problems = offer_from_row(row, currencies)
        problems += [f"{label}: {p}" for p in row_problems]
        if offer is None:
            continue
        if offer.id in seen:
            problems.append(f"{label}: id '{offer.id}' repeats {seen[offer.id]}")
        seen[offer.id] = label
        offers.append(offer)
    if problems:
        shown = "; ".join(problems[:5]) + (f"; and {len(problems) - 5} more" if len(problems) > 5 else "")
        raise ConfigError(
            f"bad offers file {origin}: {shown}",
            hint=f"fix the rows named above; the columns are {', '.join(FIELDS)}",
        )
    return offers


def read_offers_file(path: Path, known_currencies: Iterable[str] = DEFAULT_UNITS_PER_USD) -> list[Offer]:
    """Read offers from a .csv (header row) or .toml file (`[[offer]]` tables); validate every row."""
    if not path.is_file():
        raise NotFoundError(
            f"offers file '{path}' does not exist", hint="pass a CSV or TOML file to --offers"
        )
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as error:
        raise ConfigError(
            f"offers file '{path}' is not UTF-8 text (byte {error.object[error.start]:#04x} at offset "
            f"{error.start})",
            hint="save it as UTF-8 CSV or TOML",
        ) from None
    except OSError as error:
        raise ConfigError(
            f"cannot read offers file '{path}': {error.strerror or error}",
            hint="check the path and its permissions",
        ) from None
    if path.suffix.lower() == ".toml":
        return parse_offers(_toml_rows(text, path), str(path), known_currencies)
    if path.suffix.lower() != ".csv":
        raise ConfigError(
            f"offers file '{path}' is neither .csv nor .toml", hint="rename it to .csv or .toml"
        )
    reader = csv.DictReader(text.splitlines())
    missing = [f for f in REQUIRED if f not in (reader.fieldnames or [])]
    if missing:
        raise ConfigError(
            f"bad offers file {path}: header lacks column(s) {', '.join(missing)}",
            hint=f"the first row must name the columns: {', '.join(FIELDS)}",
        )
    # Row numbers count the header as line 1, as a spreadsheet shows them.
    return parse_offers(
        ((f"row {i}", row) for i, row in enumerate(reader, start=2)), str(path), known_currencies
    )


def _toml_rows(text: str, path: Path) -> list[tuple[str, Mapping[str, Any]]]:
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover - Python 3.10
        import tomli as tomllib
    try:
        document = tomllib.loads(text)
    except tomllib.TOMLDecodeError as error:
        raise ConfigError(f"bad offers file {path}: {error}", hint="check the TOML syntax") from None
    tables = document.get("offer")
    if not isinstance(tables, list) or not all(isinstance(t, dict) for t in tables):
        raise ConfigError(
            f"bad offers file {path}: expected [[offer]] tables",
            hint="write each offer as an [[offer]] table",
        )
    return [(f"offer {i} ({t.get('id', '?')})", t) for i, t in enumerate(tables, start=1)]


def bundled_offers() -> list[Offer]:
    """The offers shipped with rentwise (src/rentwise/planning/offers.csv)."""
    path = resources.files("rentwise.planning").joinpath("offers.csv")
    with resources.as_file(path) as real:
        return read_offers_file(Path(real))


def user_offers_path() -> Path | None:
    """`offers.toml` or `offers.csv` in the rentwise config dir ($RENTWISE_CONFIG_DIR, else the platform's
    config folder, as for the GPU catalog), if one exists."""
    from rentwise.hardware.catalog import user_config_dir

    base = user_config_dir()
    for name in ("offers.toml", "offers.csv"):
        if (base / name).is_file():
            return base / name
    return None


def merge_offers(base: Sequence[Offer], overrides: Sequence[Offer]) -> list[Offer]:
    """`base` with rows of the same id replaced by `overrides`, then the new ones appended."""
    by_id = {o.id: o for o in overrides}
    merged = [by_id.pop(o.id, o) for o in base]
    return merged + [o for o in overrides if o.id in by_id]


def load_offers(
    extra_files: Sequence[Path] = (), currency: Currency | None = None, use_user_file: bool = True
) -> list[Offer]:
    """Bundled offers, overridden by the user config file, then by each `--offers` file in order."""
    known = (currency or Currency()).rates
    offers = bundled_offers()
    paths = ([p] if use_user_file and (p := user_offers_path()) else []) + list(extra_files)
    for path in paths:
        offers = merge_offers(offers, read_offers_file(path, known))
    return offers


@dataclass(frozen=True)
class OfferFilter:
    """Which offers to keep; empty fields keep everything."""

    gpu: str = ""
    provider: str = ""
    region: str = ""
    billing: str = ""
    min_gpus: int = 1
    max_gpus: int | None = None
    max_price_per_hour: float | None = None
    """In the display currency, for the cheapest billing mode the offer has."""


def filter_offers(offers: Sequence[Offer], wanted: OfferFilter, currency: Currency) -> list[Offer]:
    """Offers matching every set field of `wanted` (case-insensitive substring match on names)."""
    if wanted.billing and wanted.billing not in BILLINGS:
        raise ConfigError(
            f"billing '{wanted.billing}' is not one of {', '.join(BILLINGS)}"
            f"{did_you_mean(wanted.billing, BILLINGS)}",
            hint="use on_demand, spot, weekly or monthly",
        )
    kept = []
    for offer in offers:
        if wanted.gpu and wanted.gpu.lower().replace(" ", "") not in offer.gpu.lower().replace(" ", ""):
            continue
        if wanted.provider and wanted.provider.lower() not in offer.provider.lower():
            continue
        if wanted.region and wanted.region.lower() not in offer.region.lower():
            continue
        if wanted.billing and offer.price_per_hour(wanted.billing) is None:
            continue
        if offer.gpu_count < wanted.min_gpus or (
            wanted.max_gpus is not None and offer.gpu_count > wanted.max_gpus
        ):
            continue
        if wanted.max_price_per_hour is not None:
            prices = [
                currency.convert(p, offer.currency)
                for b in offer.billings()
                if (p := offer.price_per_hour(b)) is not None
            ]
            if min(prices, default=math.inf) > wanted.max_price_per_hour:
                continue
        kept.append(offer)
    return kept


def with_currency(offer: Offer, currency: Currency) -> Offer:
    """A copy of `offer` with every price converted into `currency.code`."""
    money = ("on_demand_per_hour", "spot_per_hour", "weekly_per_hour", "monthly_per_hour",
             "storage_per_gb_day", "egress_per_gb", "snapshot_per_gb_month")  # fmt: skip
    changes: dict[str, Any] = {
        name: None if getattr(offer, name) is None else currency.convert(getattr(offer, name), offer.currency)
        for name in money
    }
    return replace(offer, currency=currency.code, **changes)
