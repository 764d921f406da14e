from __future__ import annotations

from pathlib import Path

import pytest

from rentwise.errors import ConfigError, NotFoundError
from rentwise.hardware.catalog import find_gpu
from rentwise.planning.offers import (
    Currency,
    OfferFilter,
    bundled_offers,
    filter_offers,
    load_offers,
    parse_fx,
    read_offers_file,
    with_currency,
)

HEADER = "id,provider,region,gpu,gpu_count,currency,on_demand_per_hour,spot_per_hour,source\n"


def test_bundled_catalog_is_valid_and_maps_onto_gpu_catalog() -> None:
    offers = bundled_offers()
    assert len(offers) > 150
    assert len({o.id for o in offers}) == len(offers)
    for offer in offers:
        assert find_gpu(offer.gpu).name == offer.gpu
        assert offer.source
        assert offer.billings()
    assert {"USD", "CNY"} <= {o.currency for o in offers}


def test_bad_rows_are_named_with_their_field(tmp_path: Path) -> None:
    path = tmp_path / "mine.csv"
    path.write_text(HEADER + "a,P,r,RTX 4090,1,USD,abc,,me\nb,P,r,RTX 4090,0,XYZ,1.0,,me\n")
    with pytest.raises(ConfigError) as raised:
        read_offers_file(path)
    message = raised.value.message
    assert "row 2: on_demand_per_hour 'abc' is not a number" in message
    assert "row 3: gpu_count must be positive, got 0" in message
    assert "row 3: currency 'XYZ' has no exchange rate" in message


def test_duplicate_ids_and_missing_prices_are_rejected(tmp_path: Path) -> None:
    path = tmp_path / "dup.csv"
    path.write_text(HEADER + "a,P,r,L4,1,USD,1,,me\na,P,r,L4,1,USD,,,me\n")
    with pytest.raises(ConfigError, match=r"row 3: no price"):
        read_offers_file(path)
    path.write_text(HEADER + "a,P,r,L4,1,USD,1,,me\na,P,r,L4,1,USD,2,,me\n")
    with pytest.raises(ConfigError, match=r"row 3: id 'a' repeats row 2"):
        read_offers_file(path)


def test_missing_header_column(tmp_path: Path) -> None:
    path = tmp_path / "short.csv"
    path.write_text("id,provider\nx,y\n")
    with pytest.raises(ConfigError, match="header lacks column"):
        read_offers_file(path)


def test_toml_offers_override_bundled_rows(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RENTWISE_CONFIG_DIR", str(tmp_path / "none"))
    path = tmp_path / "mine.toml"
    path.write_text(
        '[[offer]]\nid = "runpod-us-1x-rtx4090-secure"\nprovider = "RunPod"\ngpu = "RTX 4090"\n'
        'gpu_count = 1\ncurrency = "USD"\non_demand_per_hour = 0.5\nsource = "my quote"\n'
        '[[offer]]\nid = "home"\nprovider = "Lab"\ngpu = "RTX 3090"\ngpu_count = 2\ncurrency = "CNY"\n'
        'on_demand_per_hour = 1.0\nsource = "electricity"\n'
    )
    offers = {o.id: o for o in load_offers([path])}
    assert offers["runpod-us-1x-rtx4090-secure"].on_demand_per_hour == 0.5
    assert offers["runpod-us-1x-rtx4090-secure"].source == "my quote"
    assert offers["home"].gpu_count == 2
    assert len(offers) == len(bundled_offers()) + 1


def test_user_config_dir_file_is_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RENTWISE_CONFIG_DIR", str(tmp_path))
    (tmp_path / "offers.csv").write_text(HEADER + "mine,Lab,home,RTX 3090,1,USD,0.1,,me\n")
    assert any(o.id == "mine" for o in load_offers())


def test_missing_file_and_bad_toml(tmp_path: Path) -> None:
    with pytest.raises(NotFoundError):
        read_offers_file(tmp_path / "nope.csv")
    bad = tmp_path / "bad.toml"
    bad.write_text("[[offer]\n")
    with pytest.raises(ConfigError, match="bad offers file"):
        read_offers_file(bad)


def test_currency_conversion_round_trips_and_uses_stated_rate() -> None:
    cny = Currency("CNY")
    assert cny.convert(0.138, "USD") == pytest.approx(1.0)  # the source's 0.138 USD per CNY
    assert Currency("USD").convert(cny.convert(5.0, "USD"), "CNY") == pytest.approx(5.0)
    custom = Currency("CNY", parse_fx(["CNY=7.0"]))
    assert custom.convert(1.0, "USD") == pytest.approx(7.0)


def test_unknown_currency_and_bad_rate() -> None:
    with pytest.raises(ConfigError, match="unknown currency 'EUR'"):
        Currency("EUR")
    assert Currency("EUR", parse_fx(["EUR=0.9"])).convert(0.9, "EUR") == pytest.approx(0.9)
    with pytest.raises(ConfigError, match="cannot read exchange rate"):
        parse_fx(["CNY=abc"])


def test_filter_and_convert() -> None:
    offers = bundled_offers()
    cny = Currency("CNY")
    kept = filter_offers(offers, OfferFilter(gpu="4090", billing="spot"), cny)
    assert kept and all("4090" in o.gpu and o.spot_per_hour is not None for o in kept)
    cheap = filter_offers(offers, OfferFilter(max_price_per_hour=1.0), Currency())
    assert all(
        min(Currency().convert(o.price_per_hour(b) or 9e9, o.currency) for b in o.billings()) <= 1.0
        for o in cheap
    )
    usd = next(o for o in offers if o.currency == "USD" and o.on_demand_per_hour)
    assert with_currency(usd, cny).on_demand_per_hour == pytest.approx(usd.on_demand_per_hour / 0.138)
