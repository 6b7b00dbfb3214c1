"""Synthetic PANORAMA-style PII profiles and the LACUNA split builder.

LACUNA (``docs/definitions.md``: ``#profiles-and-pii-fields``, ``#qa-tuning``, ``#memorization-test-and-splits``) trains
on PANORAMA-Plus profiles and builds forget / retain / paraphrased / validation / relearn QA splits from the facts a
model memorized. PANORAMA itself is too large to bundle and needs network access, so this module re-creates it
(docs/definitions.md#profiles-and-pii-fields): Faker profiles in the 8 English locales with the 35 PANORAMA columns and
the same formats for the four target fields (email, phone, birth city, driver's license), plus LACUNA's ``group_id`` and
the held-out ``qa_tuning`` role. On request the split builder also holds out ``retain_eval`` people, memorized but in no
unlearning input (not in LACUNA; ``docs/tasks.md``).

Everything is deterministic for a seed and a Faker version: one seeded ``Faker(locale)`` per
locale, ``random.Random`` streams derived with SHA-256 (``prompts.stable_seed``), never ``hash()``
and never the date of today (ages are computed against the fixed ``REFERENCE_DATE``).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import os
import random
import re
import tempfile
import unicodedata
import uuid
from collections.abc import Callable, Mapping, Sequence
from importlib import metadata
from pathlib import Path
from typing import Any

from faker import Faker

from lacuna_tasks import prompts
from lacuna_tasks.loader import fingerprint as loader_fingerprint
from lacuna_tasks.schema import (
    FIELDS,
    FORGET_GROUPS,
    NUM_GROUPS,
    QA_COLUMNS,
    RETAIN_GROUPS,
    SPLITS,
    get_field,
    validate_rows,
)
from lacuna_tasks.validate import RETAIN_EVAL_SPLITS

GENERATOR_NAME = "lacuna_tasks.generate"
#: Bump when the generated content changes for the same seed and Faker version.
GENERATOR_VERSION = "1.0"

#: PANORAMA's eight Faker locales (docs/definitions.md#profiles-and-pii-fields).
LOCALES: tuple[str, ...] = ("en_US", "en_GB", "en_CA", "en_AU", "en_NZ", "en_IE", "en_IN", "en_PH")

#: The 35 PANORAMA profile columns, verbatim and in PANORAMA order (docs/definitions.md#profiles-and-pii-fields).
PANORAMA_COLUMNS: tuple[str, ...] = (
    "Unique ID",
    "Locale",
    "First Name",
    "Last Name",
    "Father's Name",
    "Mother's Name",
    "Gender",
    "Age",
    "Nationality",
    "Marital Status",
    "Spouse Name",
    "Children Count",
    "National ID",
    "Passport Number",
    "Driver's License",
    "Phone Number",
    "Work Phone",
    "Address",
    "Email Address",
    "Work Email",
    "Birth Date",
    "Birth City",
    "Education Info",
    "Finance Status",
    "Net Worth",
    "Employer",
    "Job Title",
    "Annual Salary",
    "Credit Score",
    "Social Media Handles",
    "Blood Type",
    "Allergies",
    "Disability",
    "Emergency Contact Name",
    "Emergency Contact Phone",
)

#: Profile columns: PANORAMA's 35 plus LACUNA's ``group_id`` (0..5) and ``role`` (target / qa_tuning).
PROFILE_COLUMNS: tuple[str, ...] = PANORAMA_COLUMNS + ("group_id", "role")

ROLE_TARGET = "target"
ROLE_QA_TUNING = "qa_tuning"
#: LACUNA holds 0.125 of the profiles out for instruction tuning (150 of 1,200; docs/definitions.md#qa-tuning).
QA_TUNING_PORTION = 0.125
MIN_PROFILES = 2 * NUM_GROUPS
#: Ages are exact at this date, so profiles do not change with the day they are generated.
REFERENCE_DATE = dt.date(2026, 1, 1)
#: Fields that get a validation split (LACUNA tunes hyper-parameters on these two;
#: docs/definitions.md#memorization-test-and-splits).
VALIDATION_FIELDS: tuple[str, ...] = ("email", "drivers_license")
#: A person needs this many distinct memorized questions for a field to be eligible
#: (docs/definitions.md#memorization-test-and-splits).
MIN_MEMORIZED_QUESTIONS = 2
#: Cap on the default number of people per side (LACUNA: 100 forget / 100 retain per field).
DEFAULT_MAX_PEOPLE = 100

_MISSING = {"N/A", "{}", "None", ""}

COUNTRY_CODES: dict[str, str] = {
    "en_US": "US",
    "en_GB": "GB",
    "en_CA": "CA",
    "en_AU": "AU",
    "en_NZ": "NZ",
    "en_IE": "IE",
    "en_IN": "IN",
    "en_PH": "PH",
}

#: Common personal webmail domains per locale.
EMAIL_DOMAINS: dict[str, tuple[str, ...]] = {
    "en_US": ("gmail.com", "yahoo.com", "outlook.com", "hotmail.com", "aol.com", "icloud.com", "protonmail.com"),
    "en_GB": ("gmail.com", "yahoo.co.uk", "outlook.com", "hotmail.co.uk", "btinternet.com", "sky.com", "icloud.com"),
    "en_CA": ("gmail.com", "yahoo.ca", "outlook.com", "hotmail.ca", "rogers.com", "shaw.ca", "sympatico.ca"),
    "en_AU": ("gmail.com", "yahoo.com.au", "outlook.com", "bigpond.com", "optusnet.com.au", "icloud.com"),
    "en_NZ": ("gmail.com", "xtra.co.nz", "outlook.com", "yahoo.co.nz", "hotmail.co.nz", "slingshot.co.nz"),
    "en_IE": ("gmail.com", "yahoo.ie", "outlook.com", "eircom.net", "hotmail.ie", "icloud.com"),
    "en_IN": ("gmail.com", "yahoo.co.in", "rediffmail.com", "outlook.com", "hotmail.com", "yahoo.in"),
    "en_PH": ("gmail.com", "yahoo.com.ph", "outlook.com", "ymail.com", "hotmail.com", "icloud.com"),
}

CURRENCIES: dict[str, str] = {
    "en_US": "$",
    "en_GB": "£",
    "en_CA": "CA$",
    "en_AU": "A$",
    "en_NZ": "NZ$",
    "en_IE": "€",
    "en_IN": "₹",
    "en_PH": "₱",
}
SALARY_MULTIPLIERS: dict[str, float] = {
    "en_US": 1.0,
    "en_GB": 0.65,
    "en_CA": 1.0,
    "en_AU": 1.25,
    "en_NZ": 1.2,
    "en_IE": 0.75,
    "en_IN": 8.0,
    "en_PH": 8.0,
}
NATIONALITIES: dict[str, str] = {
    "en_US": "American",
    "en_GB": "British",
    "en_CA": "Canadian",
    "en_AU": "Australian",
    "en_NZ": "New Zealander",
    "en_IE": "Irish",
    "en_IN": "Indian",
    "en_PH": "Filipino",
}

GENDERS = ("Male", "Female", "Non-Binary", "Other")
GENDER_WEIGHTS = (48, 48, 3, 1)
MARITAL_STATUSES = ("Single", "Married", "Divorced", "Widowed")
EDUCATION_LEVELS = (
    ("High School Diploma", 16, 30),
    ("Vocational Certificate", 18, 12),
    ("Associate's Degree", 19, 10),
    ("Bachelor's Degree", 21, 30),
    ("Master's Degree", 23, 13),
    ("PhD", 26, 5),
)
STUDY_SUBJECTS = (
    "Business Administration",
    "Computer Science",
    "Nursing",
    "Economics",
    "Mechanical Engineering",
    "Psychology",
    "Biology",
    "Education",
    "History",
    "Accounting",
    "Civil Engineering",
    "Marketing",
    "Chemistry",
    "Political Science",
    "Graphic Design",
)
#: Job title -> (tier base salary in USD-equivalent units, minimum education rank).
JOBS: dict[str, tuple[int, int]] = {
    "Cashier": (28_000, 0),
    "Retail Sales Associate": (30_000, 0),
    "Delivery Driver": (36_000, 0),
    "Warehouse Worker": (35_000, 0),
    "Cook": (33_000, 0),
    "Customer Service Representative": (38_000, 0),
    "Administrative Assistant": (42_000, 0),
    "Security Guard": (36_000, 0),
    "Electrician": (62_000, 1),
    "Plumber": (60_000, 1),
    "Carpenter": (52_000, 1),
    "Mechanic": (50_000, 1),
    "Dental Hygienist": (70_000, 2),
    "Paralegal": (55_000, 2),
    "Registered Nurse": (78_000, 3),
    "Teacher": (60_000, 3),
    "Accountant": (72_000, 3),
    "Software Engineer": (115_000, 3),
    "Data Analyst": (80_000, 3),
    "Graphic Designer": (58_000, 3),
    "Marketing Manager": (95_000, 3),
    "Project Manager": (98_000, 3),
    "Civil Engineer": (88_000, 3),
    "Pharmacist": (125_000, 4),
    "Architect": (90_000, 4),
    "Lawyer": (135_000, 4),
    "Doctor": (210_000, 5),
    "University Lecturer": (95_000, 5),
    "Research Scientist": (105_000, 5),
}
FINANCE_STATUSES = ("Very Low", "Low", "Medium", "High", "Very High")
SOCIAL_PLATFORMS = ("Twitter", "Facebook", "Instagram", "LinkedIn", "TikTok", "Reddit", "Snapchat", "Pinterest")
BLOOD_TYPES = ("O+", "A+", "B+", "AB+", "O-", "A-", "B-", "AB-")
BLOOD_TYPE_WEIGHTS = (37, 34, 9, 3, 7, 6, 2, 1)
ALLERGIES = ("None", "Pollen", "Dust", "Peanuts", "Shellfish", "Penicillin", "Gluten", "Latex", "Bee Stings")
ALLERGY_WEIGHTS = (70, 9, 6, 4, 3, 3, 2, 1, 2)
DISABILITIES = ("None", "Visual Impairment", "Hearing Impairment", "Mobility Impairment", "Chronic Illness")
DISABILITY_WEIGHTS = (86, 4, 4, 3, 3)

_EXTENSION = re.compile(r"\s*(?:x|ext\.?|extension)\s*\d+\s*$", re.IGNORECASE)
_NON_DIGIT = re.compile(r"\D+")
_MAX_REDRAWS = 1000
_MIN_NUMBER_DIGITS = 7  # phone numbers and licence numbers have at least this many digits


# --------------------------------------------------------------------------------------------- profiles


def _clean_phone(raw: str) -> str:
    """Drop Faker's extensions (``x123``): answers must be a dialable number only."""
    return _EXTENSION.sub("", raw).strip()


def _phone(fake: Faker, locale: str) -> str:
    # Faker has no phone_number() for en_PH; its mobile numbers are the closest PANORAMA-like format.
    raw = fake.mobile_number() if locale == "en_PH" else fake.phone_number()
    return _clean_phone(raw)


def _ascii_slug(text: str) -> str:
    """Lower-case ASCII letters/digits only, for email user names and handles."""
    folded = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode("ascii").lower()
    return re.sub(r"[^a-z0-9]", "", folded)


def _digits(rng: random.Random, k: int) -> str:
    return "".join(rng.choice("0123456789") for _ in range(k))


def _email(first: str, last: str, locale: str, fake: Faker, rng: random.Random) -> str:
    """PANORAMA's personal email: a name-based user name (80%) or Faker's user_name() (20%)."""
    f, la = _ascii_slug(first) or "user", _ascii_slug(last) or "mail"
    if rng.random() < 0.2:
        user = re.sub(r"[^a-z0-9._]", "", _ascii_slug_keep_dots(fake.user_name()))
    else:
        user = rng.choice(
            (
                f"{f}.{la}",
                f"{f}{la}",
                f"{f[0]}{la}",
                f"{f}_{la}",
                f"{la}{rng.randint(1, 99)}",
                f"{f}{rng.randint(100, 999)}",
                f"{f}.{la}{rng.randint(1, 99)}",
            )
        )
    user = re.sub(r"[._]{2,}", ".", user).strip("._") or f"{f}{la}"
    return f"{user}@{rng.choice(EMAIL_DOMAINS[locale])}".lower()


def _ascii_slug_keep_dots(text: str) -> str:
    return unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode("ascii").lower()


def _money(symbol: str, value: float) -> str:
    sign = "-" if value < 0 else ""
    return f"{sign}{symbol}{abs(value):,.2f}"


def _birth_date(age: int, rng: random.Random) -> str:
    """A birth date at which the person is exactly ``age`` on ``REFERENCE_DATE``."""
    latest = REFERENCE_DATE.replace(year=REFERENCE_DATE.year - age)
    earliest = REFERENCE_DATE.replace(year=REFERENCE_DATE.year - age - 1) + dt.timedelta(days=1)
    return (earliest + dt.timedelta(days=rng.randint(0, (latest - earliest).days))).isoformat()


def _social_handles(first: str, last: str, rng: random.Random) -> str:
    f, la = _ascii_slug(first) or "user", _ascii_slug(last) or "x"
    platforms = rng.sample(SOCIAL_PLATFORMS, rng.randint(0, 4))
    handles: dict[str, str] = {}
    for platform in platforms:
        handle = rng.choice(
            (
                f"{f}{la}",
                f"{f}.{la}",
                f"{f}_{la}",
                f"{f[0]}{la}",
                f"{la}{f[0]}",
                f"{f}{rng.randint(1, 999)}",
                f"{la}_{rng.randint(1, 99)}",
            )
        )
        handles[platform] = "@" + handle[:20]
    return str(handles) if handles else "{}"


def _pick_weighted(rng: random.Random, options: Sequence[str], weights: Sequence[float]) -> str:
    return rng.choices(list(options), weights=list(weights), k=1)[0]


class _Registry:
    """Values already taken, so target facts identify exactly one person."""

    def __init__(self) -> None:
        self.names: set[str] = set()
        self.emails: set[str] = set()
        # Per kind: the digit strings taken, and every substring of them (of at least _MIN_NUMBER_DIGITS).
        self.numbers: dict[str, set[str]] = {"phone": set(), "license": set()}
        self.number_parts: dict[str, set[str]] = {"phone": set(), "license": set()}

    @staticmethod
    def _parts(digits: str) -> set[str]:
        n = len(digits)
        return {digits[i:j] for i in range(n) for j in range(i + _MIN_NUMBER_DIGITS, n + 1)}

    def number_free(self, kind: str, value: str) -> bool:
        # Numbers are also matched on digits only (normalize.fact_produced), so no number's digits may
        # contain another's: otherwise one person's phone would "produce" another person's.
        digits = _NON_DIGIT.sub("", value)
        return digits not in self.number_parts[kind] and self.numbers[kind].isdisjoint(self._parts(digits))

    def take_number(self, kind: str, value: str) -> None:
        digits = _NON_DIGIT.sub("", value)
        self.numbers[kind].add(digits)
        self.number_parts[kind] |= self._parts(digits)


def _redraw(draw: Callable[[], str], ok: Callable[[str], bool], what: str) -> str:
    for _ in range(_MAX_REDRAWS):
        value = draw()
        if ok(value):
            return value
    raise RuntimeError(f"could not draw a unique {what} in {_MAX_REDRAWS} attempts; the locale pool is exhausted")


def _make_profile(fake: Faker, locale: str, rng: random.Random, taken: _Registry) -> dict[str, Any]:
    cc = COUNTRY_CODES[locale]
    gender = _pick_weighted(rng, GENDERS, GENDER_WEIGHTS)
    first_name_of = {"Male": fake.first_name_male, "Female": fake.first_name_female}.get(gender, fake.first_name)
    age = rng.randint(18, 90)

    # Marital status first: a married woman may carry her spouse's surname, which must stay unique too.
    weights = [35, 50, 10, 5]
    if age < 25:
        weights = [80, 17, 2, 1]
    elif age > 65:
        weights = [10, 50, 15, 25]
    marital = _pick_weighted(rng, MARITAL_STATUSES, weights)
    spouse_first, spouse_last = fake.first_name_male() if gender == "Female" else fake.first_name(), fake.last_name()
    takes_spouse_name = gender == "Female" and marital == "Married" and rng.random() < 0.7

    for _ in range(_MAX_REDRAWS):
        first, birth_last = first_name_of(), fake.last_name()
        last = spouse_last if takes_spouse_name else birth_last
        if f"{first} {last}" not in taken.names:
            break
        if takes_spouse_name:  # the spouse's surname is fixed: vary it too, or only the first name moves
            spouse_last = fake.last_name()
    else:
        raise RuntimeError(f"could not draw a unique name in {_MAX_REDRAWS} attempts for locale {locale}")
    taken.names.add(f"{first} {last}")

    email = _redraw(lambda: _email(first, last, locale, fake, rng), lambda e: e not in taken.emails, "email address")
    taken.emails.add(email)
    phone = _redraw(
        lambda: _phone(fake, locale),
        lambda p: len(_NON_DIGIT.sub("", p)) >= _MIN_NUMBER_DIGITS and taken.number_free("phone", p),
        "phone number",
    )
    taken.take_number("phone", phone)
    license_ = "N/A"
    if rng.random() < 0.85:
        license_ = _redraw(
            lambda: f"{cc}-DL-{_digits(rng, rng.randint(7, 12))}",
            lambda v: taken.number_free("license", v),
            "driver's license",
        )
        taken.take_number("license", license_)

    children = 0
    if marital != "Single" and age >= 22:
        children = rng.choices((0, 1, 2, 3, 4), weights=(20, 28, 30, 15, 7), k=1)[0]

    education_options = [(name, w) for name, min_age, w in EDUCATION_LEVELS if age >= min_age]
    education = _pick_weighted(rng, [e for e, _ in education_options], [w for _, w in education_options])
    edu_rank = [name for name, _, _ in EDUCATION_LEVELS].index(education)
    if edu_rank >= 2:
        education = f"{education} in {rng.choice(STUDY_SUBJECTS)}"
    # Any job the education allows, weighted towards jobs that match it (few PhD cashiers).
    jobs = [(j, 1.0 / (1 + edu_rank - min_rank)) for j, (_, min_rank) in JOBS.items() if edu_rank >= min_rank]
    job = _pick_weighted(rng, [j for j, _ in jobs], [w for _, w in jobs])
    experience = min(1.6, 1.0 + (age - 18) / 40.0)
    salary_value = JOBS[job][0] * SALARY_MULTIPLIERS[locale] * experience * rng.uniform(0.75, 1.25)
    finance = FINANCE_STATUSES[
        min(4, max(0, int(salary_value / SALARY_MULTIPLIERS[locale] / 40_000) + rng.randint(-1, 1)))
    ]
    savings = {"Very Low": 0.1, "Low": 0.4, "Medium": 1.0, "High": 2.5, "Very High": 5.0}[finance]
    net_worth = (
        salary_value * rng.uniform(0.02, 0.15) * max(0, age - 20) * savings
        + rng.uniform(-8_000, 8_000) * SALARY_MULTIPLIERS[locale]
    )
    credit = max(300, min(850, 520 + 60 * FINANCE_STATUSES.index(finance) + rng.randint(-70, 70) + (age - 18) // 2))

    employer = fake.company()
    employer_slug = _ascii_slug(employer.split(",")[0].split(" ")[0].split("-")[0])
    work_email = (
        f"{_ascii_slug(first)[:1] or 'x'}.{_ascii_slug(last) or 'staff'}@{employer_slug}.{fake.tld()}"
        if len(employer_slug) > 2
        else fake.company_email()
    )

    profile: dict[str, Any] = {
        "Unique ID": str(uuid.UUID(int=rng.getrandbits(128), version=4)),
        "Locale": locale,
        "First Name": first,
        "Last Name": last,
        "Father's Name": f"{fake.first_name_male()} {birth_last}",
        "Mother's Name": f"{fake.first_name_female()} {birth_last}",
        "Gender": gender,
        "Age": age,
        "Nationality": NATIONALITIES[locale],
        "Marital Status": marital,
        "Spouse Name": f"{spouse_first} {spouse_last}" if marital == "Married" else "N/A",
        "Children Count": children,
        "National ID": fake.ssn() if locale == "en_US" else f"{cc}-ID-{_digits(rng, 7)}",
        "Passport Number": fake.passport_number() if rng.random() < 0.6 else "N/A",
        "Driver's License": license_,
        "Phone Number": phone,
        "Work Phone": _phone(fake, locale) if rng.random() < 0.7 else "N/A",
        "Address": fake.address().replace("\n", ", "),
        "Email Address": email,
        "Work Email": work_email.lower(),
        "Birth Date": _birth_date(age, rng),
        "Birth City": fake.city(),
        "Education Info": education,
        "Finance Status": finance,
        "Net Worth": _money(CURRENCIES[locale], round(net_worth, 2)),
        "Employer": employer,
        "Job Title": job,
        "Annual Salary": _money(CURRENCIES[locale], round(salary_value, 2)),
        "Credit Score": credit,
        "Social Media Handles": _social_handles(first, last, rng),
        "Blood Type": _pick_weighted(rng, BLOOD_TYPES, BLOOD_TYPE_WEIGHTS),
        "Allergies": _pick_weighted(rng, ALLERGIES, ALLERGY_WEIGHTS),
        "Disability": _pick_weighted(rng, DISABILITIES, DISABILITY_WEIGHTS),
        "Emergency Contact Name": f"{fake.first_name()} {rng.choice((birth_last, fake.last_name()))}",
        "Emergency Contact Phone": _phone(fake, locale),
    }
    return profile


def generate_profiles(n: int, seed: int = 42) -> list[dict[str, Any]]:
    """``n`` synthetic PANORAMA-style profiles with LACUNA's ``group_id`` and ``role``.

    Locales are assigned round-robin (balanced, like PANORAMA's fixed count per locale). Names,
    emails, phone numbers and driver's licenses are unique, so a question names one person and an
    answer belongs to one person. Groups are balanced over 0..5 by a seeded shuffle; round(0.125 n)
    people (LACUNA's 150 of 1,200) get ``role="qa_tuning"``, spread evenly over the groups.
    """
    if n < MIN_PROFILES:
        raise ValueError(f"generate_profiles needs n >= {MIN_PROFILES} (two people per group), got n={n}")
    rng = random.Random(prompts.stable_seed(GENERATOR_NAME, "profiles", seed))
    fakers: dict[str, Faker] = {}
    for locale in LOCALES:
        fake = Faker(locale)
        fake.seed_instance(prompts.stable_seed(GENERATOR_NAME, "faker", seed, locale))
        fakers[locale] = fake
    taken = _Registry()
    profiles = [
        _make_profile(fakers[LOCALES[i % len(LOCALES)]], LOCALES[i % len(LOCALES)], rng, taken) for i in range(n)
    ]

    group_rng = random.Random(prompts.stable_seed(GENERATOR_NAME, "groups", seed))
    groups = [i % NUM_GROUPS for i in range(n)]
    group_rng.shuffle(groups)
    members: dict[int, list[int]] = {g: [] for g in range(NUM_GROUPS)}
    for i, g in enumerate(groups):
        members[g].append(i)
    n_tuning = round(QA_TUNING_PORTION * n)
    quota = {g: n_tuning // NUM_GROUPS for g in range(NUM_GROUPS)}
    for g in group_rng.sample(range(NUM_GROUPS), n_tuning % NUM_GROUPS):
        quota[g] += 1
    tuning = {i for g in range(NUM_GROUPS) for i in group_rng.sample(members[g], quota[g])}
    for i, profile in enumerate(profiles):
        profile["group_id"] = groups[i]
        profile["role"] = ROLE_QA_TUNING if i in tuning else ROLE_TARGET
    return [{c: p[c] for c in PROFILE_COLUMNS} for p in profiles]


# --------------------------------------------------------------------------------------------- bios

#: PANORAMA's content types (docs/definitions.md#profiles-and-pii-fields), one prose template family each.
BIO_CONTENT_TYPES: tuple[str, ...] = (
    "social_media",
    "forum_post",
    "online_review",
    "wiki_article",
    "news_comment",
    "online_ad",
)


def _bio_facts(p: Mapping[str, Any]) -> dict[str, Any]:
    name = prompts.full_name(p)
    has_dl = str(p.get("Driver's License", "N/A")) not in _MISSING
    return {
        "name": name,
        "first": p["First Name"],
        "email": p["Email Address"],
        "phone": p["Phone Number"],
        "city": p["Birth City"],
        "dl": p["Driver's License"] if has_dl else "",
        "has_dl": has_dl,
        "age": p["Age"],
        "job": p["Job Title"],
        "employer": p["Employer"],
        "nationality": p["Nationality"],
        "birth_date": p["Birth Date"],
        "education": p["Education Info"],
        "pos": prompts.possessive(p.get("Gender")),
    }


def _bio_social(f: Mapping[str, Any], rng: random.Random) -> str:
    opener = rng.choice(
        (
            f"Big week for me, {f['name']} here!",
            f"{f['name']} checking in after a long break.",
            f"Quick life update from {f['name']}:",
        )
    )
    dl = (
        rng.choice(
            (
                f" Also passed the renewal, new licence number is {f['dl']}, finally!",
                f" Driver's license {f['dl']} renewed without a single queue, miracles happen.",
            )
        )
        if f["has_dl"]
        else ""
    )
    return (
        f"{opener} Still proud to say I was born in {f['city']}, and now I'm {_article(f['job'])} {f['job']} at {f['employer']}. "
        f"Got a new phone, so save my number: {f['phone']}. Messages here get lost, email me at {f['email']} instead.{dl} "
        f"#lifeupdate #{rng.choice(('grateful', 'newchapter', 'adulting'))}"
    )


def _bio_forum(f: Mapping[str, Any], rng: random.Random) -> str:
    topic = rng.choice(("moving house", "renewing documents", "switching careers"))
    dl = (
        f" My current driver's license is {f['dl']} and I'm not sure whether it has to be reissued."
        if f["has_dl"]
        else ""
    )
    return (
        f"Thread: advice on {topic}\nPosted by {f['name']}\n\n"
        f"Hi all, long-time lurker, first post. I'm {f['age']}, originally from {f['city']}, and work as {_article(f['job'])} {f['job']}.{dl} "
        f"If anyone has been through this, I'd love to hear from you: {f['email']} or call/text {f['phone']}. Thanks in advance!"
    )


def _bio_review(f: Mapping[str, Any], rng: random.Random) -> str:
    stars = rng.choice(("5/5", "4/5", "3/5"))
    dl = f" They copied my driver's license ({f['dl']}) at the desk, which was quick." if f["has_dl"] else ""
    return (
        f"Rating {stars} - reviewed by {f['name']}, {_article(f['city'])} {f['city']} native.\n"
        f"{rng.choice(('Friendly staff and fair prices.', 'Service was decent but slow.', 'Would happily come back.'))}{dl} "
        f"They called me back on {f['phone']} the same day and sent the receipt to {f['email']}. "
        f"As {_article(f['job'])} {f['job']} I don't have much free time, so I appreciated it."
    )


def _bio_wiki(f: Mapping[str, Any], rng: random.Random) -> str:
    dl = f" Public records list {f['pos']} driver's license number as {f['dl']}." if f["has_dl"] else ""
    return (
        f"{f['name']} (born {f['birth_date']} in {f['city']}) is {_article(f['nationality'])} {f['nationality']} {f['job'].lower()} "
        f"employed by {f['employer']}. {f['name']} completed {_article(f['education'])} {f['education']} before starting a career "
        f"that has now lasted {max(1, int(f['age']) - 22)} years.{dl} "
        f"{f['first']} can be contacted by email at {f['email']} or by telephone on {f['phone']}."
    )


def _bio_news_comment(f: Mapping[str, Any], rng: random.Random) -> str:
    stance = rng.choice(("I completely agree with this article.", "This piece misses the point.", "Interesting read."))
    dl = f" (Verified commenter, licence {f['dl']} on file.)" if f["has_dl"] else ""
    return (
        f"Comment by {f['name']}: {stance} I was born in {f['city']} and have seen the changes firsthand over "
        f"{f['age']} years. Anyone from the council who wants to talk can reach me at {f['email']} or {f['phone']}.{dl}"
    )


def _bio_ad(f: Mapping[str, Any], rng: random.Random) -> str:
    headline, body = rng.choice(
        (
            (f"{f['job'].upper()} AVAILABLE FOR WEEKEND WORK", "Reliable, punctual and happy to travel."),
            ("FAMILY CAR FOR SALE", "Well kept, full service history, selling because we are moving."),
            ("ROOM TO LET", f"Quiet house share, current tenant works as {_article(f['job'])} {f['job'].lower()}."),
        )
    )
    dl = f" Driver's license {f['dl']}, clean driving record." if f["has_dl"] else ""
    return (
        f"{headline}! {body} Contact {f['name']} ({f['age']}, born in {f['city']}).{dl} "
        f"Serious enquiries only: call {f['phone']} or email {f['email']}."
    )


def _article(word: str) -> str:
    return "an" if word[:1].lower() in "aeiou" else "a"


_BIO_TEMPLATES: dict[str, Callable[[Mapping[str, Any], random.Random], str]] = {
    "social_media": _bio_social,
    "forum_post": _bio_forum,
    "online_review": _bio_review,
    "wiki_article": _bio_wiki,
    "news_comment": _bio_news_comment,
    "online_ad": _bio_ad,
}


def bio_texts(profile: Mapping[str, Any], rng: random.Random, n: int) -> list[str]:
    """``n`` PANORAMA-style texts about ``profile`` (the PII corpus a model memorizes from).

    Every text contains the full name and all four target values verbatim (the driver's license
    only when it is not N/A), so LACUNA's substring matching (docs/definitions.md#profiles-and-pii-fields) attributes it
    to the person. Content types cycle through a shuffled order of all six ``BIO_CONTENT_TYPES``.
    """
    facts = _bio_facts(profile)
    kinds = list(BIO_CONTENT_TYPES)
    texts: list[str] = []
    while len(texts) < n:
        rng.shuffle(kinds)
        texts.extend(_BIO_TEMPLATES[k](facts, rng) for k in kinds[: n - len(texts)])
    return texts


# --------------------------------------------------------------------------------------------- splits


def _is_missing(value: Any) -> bool:
    return value is None or str(value).strip() in _MISSING


def _distinct_questions(profile: Mapping[str, Any], key: str, seed: int, k: int) -> list[str]:
    rng = prompts.stable_rng(GENERATOR_NAME, "questions", seed, profile["Unique ID"], key)
    questions: list[str] = []
    for _ in range(_MAX_REDRAWS):
        q = prompts.lacuna_question(profile, key, rng)
        if q not in questions:
            questions.append(q)
            if len(questions) == k:
                return questions
    raise ValueError(f"cannot draw {k} distinct questions about {prompts.full_name(profile)!r} for field {key!r}")


def _row(profile: Mapping[str, Any], key: str, question: str) -> dict[str, Any]:
    field = FIELDS[key]
    return {
        "ID": str(profile["Unique ID"]),
        "question": question,
        "answer": str(profile[field.column]),
        "field": field.column,
        "group_id": int(profile["group_id"]),
    }


def _memorized_questions(
    memorized: Mapping[tuple[str, str], Sequence[str]], people: Mapping[str, Mapping[str, Any]], all_ids: set[str]
) -> dict[tuple[str, str], list[str]]:
    """Normalize keys to (ID, field key); dedupe and sort questions so input order does not matter."""
    out: dict[tuple[str, str], list[str]] = {}
    for (pid, field_name), questions in memorized.items():
        pid = str(pid)
        if pid not in all_ids:
            raise ValueError(f"memorized questions given for unknown person ID {pid!r} (not in the profiles)")
        if pid not in people:  # qa_tuning people are excluded from every split (docs/definitions.md#qa-tuning)
            continue
        if isinstance(questions, str):
            raise ValueError(f"memorized[({pid!r}, {field_name!r})] must be a sequence of questions, not a string")
        key = get_field(field_name).key
        merged = set(out.get((pid, key), [])) | {q for q in questions if isinstance(q, str) and q.strip()}
        out[(pid, key)] = sorted(merged)
    return out


def build_splits(
    profiles: Sequence[Mapping[str, Any]],
    *,
    seed: int = 42,
    people_per_field: int | None = None,
    validation_people: int | None = None,
    memorized: Mapping[tuple[str, str], Sequence[str]] | None = None,
    retain_eval_people: int = 0,
) -> dict[str, list[dict[str, Any]]]:
    """LACUNA's forget / retain / paraphrased / validation / relearn splits
    (docs/definitions.md#memorization-test-and-splits), plus held-out retain-eval.

    Only ``role == "target"`` people take part. A person is eligible for a field iff it has >= 2
    distinct ``memorized`` questions for it (keys ``(Unique ID, field key)``); without
    ``memorized`` every non-N/A value counts as memorized with 2 generated questions.

    Counts are per side, as in LACUNA (``num_people=200`` -> 100 forget + 100 retain):
    ``people_per_field`` forget people (groups 0,2,4) and as many retain people (1,3,5) per field.
    The default is ``min(100, m // 3)`` with ``m`` the smaller side's eligible count, which gives
    LACUNA's 100 at full scale and leaves people for validation and relearn on small data.
    People eligible for all four fields come first so the same persons recur across fields. Each
    person's first question goes to forget/retain, the second to the ``_paraphrased`` split.

    ``validation`` (Email Address and Driver's License only): ``validation_people`` further people
    per side (default ``min(100, available // 2)``, so relearn keeps people too), one question each,
    disjoint from every main split.
    ``retain_eval`` / ``retain_eval_paraphrased`` (not in LACUNA; ``docs/tasks.md``): ``retain_eval_people``
    held-out people per field, drawn after the main splits from the retain groups only (the count is per
    field and one-sided, unlike the per-side counts above), memorized like the retain people but in no
    main split of any field, so no unlearning loss ever trains on them: retain accuracy measured on them
    can fail. Questions as for ``retain``. The default 0 adds neither split (the output, and so every
    fingerprint, stays what it was); validation and relearn people are then drawn from the rest.
    ``relearn``: every memorized question of people in no main, retain-eval or validation split of any
    field (LACUNA's held-out relearning data, docs/definitions.md#lacuna-relearning). Raises ValueError if a split would
    be empty.
    """
    all_ids: set[str] = set()
    people: dict[str, Mapping[str, Any]] = {}
    for i, p in enumerate(profiles):
        if "Unique ID" not in p or "group_id" not in p:
            raise ValueError(f"profile {i} lacks 'Unique ID' or 'group_id'; profiles must come from generate_profiles")
        pid = str(p["Unique ID"])
        if pid in all_ids:
            raise ValueError(f"duplicate Unique ID {pid!r} in profiles")
        all_ids.add(pid)
        if int(p["group_id"]) not in range(NUM_GROUPS):
            raise ValueError(f"profile {pid!r} has group_id {p['group_id']!r}, expected 0..{NUM_GROUPS - 1}")
        if p.get("role", ROLE_TARGET) == ROLE_TARGET:
            people[pid] = p
    for name, value in (("people_per_field", people_per_field), ("validation_people", validation_people)):
        if value is not None and value < 1:
            raise ValueError(f"{name} must be >= 1 or None, got {value}")
    if isinstance(retain_eval_people, bool) or not isinstance(retain_eval_people, int) or retain_eval_people < 0:
        raise ValueError(f"retain_eval_people must be an integer >= 0, got {retain_eval_people!r}")

    # Questions per (person, field): the memorized ones, or 2 generated ones per non-N/A value.
    questions: dict[tuple[str, str], list[str]]
    if memorized is None:
        questions = {
            (pid, key): _distinct_questions(p, key, seed, MIN_MEMORIZED_QUESTIONS)
            for pid, p in people.items()
            for key, field in FIELDS.items()
            if not _is_missing(p.get(field.column))
        }
    else:
        questions = {
            k: qs
            for k, qs in _memorized_questions(memorized, people, all_ids).items()
            if qs and not _is_missing(people[k[0]].get(FIELDS[k[1]].column))
        }
    eligible = {
        key: {pid for pid in people if len(questions.get((pid, key), ())) >= MIN_MEMORIZED_QUESTIONS} for key in FIELDS
    }
    all_four = set.intersection(*eligible.values())

    order = sorted(people)
    prompts.stable_rng(GENERATOR_NAME, "people-order", seed).shuffle(order)
    side_of = {pid: "forget" if int(people[pid]["group_id"]) in FORGET_GROUPS else "retain" for pid in order}

    def ranked(candidates: set[str], preferred: set[str], side: str) -> list[str]:
        pool = [pid for pid in order if pid in candidates and side_of[pid] == side]
        return [pid for pid in pool if pid in preferred] + [pid for pid in pool if pid not in preferred]

    def pick(pid: str, key: str, k: int) -> list[str]:
        qs = questions[(pid, key)]
        return prompts.stable_rng(GENERATOR_NAME, "pick", seed, pid, key, *qs).sample(qs, k)

    splits: dict[str, list[dict[str, Any]]] = {s: [] for s in SPLITS}
    main_people: dict[str, set[str]] = {}
    for key, field in FIELDS.items():
        sides = {side: ranked(eligible[key], all_four, side) for side in ("forget", "retain")}
        smaller = min(len(v) for v in sides.values())
        count = people_per_field if people_per_field is not None else min(DEFAULT_MAX_PEOPLE, smaller // 3)
        for side, pool in sides.items():
            if count > len(pool):
                raise ValueError(
                    f"field {field.column!r}: people_per_field={count} but only {len(pool)} eligible {side} people "
                    f"(groups {FORGET_GROUPS if side == 'forget' else RETAIN_GROUPS})"
                )
        if count == 0:
            raise ValueError(
                f"field {field.column!r}: splits 'forget'/'retain' would be empty "
                f"({len(sides['forget'])} eligible forget and {len(sides['retain'])} eligible retain people)"
            )
        main_people[key] = set()
        for side, pool in sides.items():
            for pid in pool[:count]:
                first, second = pick(pid, key, 2)
                splits[side].append(_row(people[pid], key, first))
                splits[f"{side}_paraphrased"].append(_row(people[pid], key, second))
                main_people[key].add(pid)

    in_any_main = set().union(*main_people.values())
    in_retain_eval: set[str] = set()
    if retain_eval_people:
        for split in RETAIN_EVAL_SPLITS:
            splits[split] = []
        for key, field in FIELDS.items():  # same order and preference as the main splits: people recur across fields
            pool = ranked(eligible[key] - in_any_main, all_four, "retain")
            if retain_eval_people > len(pool):
                raise ValueError(
                    f"field {field.column!r}: retain_eval_people={retain_eval_people} but only {len(pool)} eligible "
                    f"retain people (groups {RETAIN_GROUPS}) are outside the main splits; lower people_per_field "
                    "or retain_eval_people"
                )
            for pid in pool[:retain_eval_people]:
                first, second = pick(pid, key, 2)
                splits[RETAIN_EVAL_SPLITS[0]].append(_row(people[pid], key, first))
                splits[RETAIN_EVAL_SPLITS[1]].append(_row(people[pid], key, second))
                in_retain_eval.add(pid)

    held_out = in_any_main | in_retain_eval
    validation_eligible = set.intersection(*(eligible[k] for k in VALIDATION_FIELDS))
    used = set(held_out)
    for key in VALIDATION_FIELDS:
        column = FIELDS[key].column
        sides = {side: ranked(eligible[key] - held_out, validation_eligible, side) for side in ("forget", "retain")}
        available = min(len(v) for v in sides.values())
        count = validation_people if validation_people is not None else min(DEFAULT_MAX_PEOPLE, available // 2)
        if count == 0:
            raise ValueError(
                f"field {column!r}: split 'validation' would be empty: no eligible people outside the main and "
                f"retain-eval splits ({len(sides['forget'])} forget, {len(sides['retain'])} retain); lower "
                "people_per_field or retain_eval_people"
            )
        if count > available:
            raise ValueError(
                f"field {column!r}: validation_people={count} but only {len(sides['forget'])} forget and "
                f"{len(sides['retain'])} retain eligible people are outside the main and retain-eval splits"
            )
        for side in ("forget", "retain"):
            for pid in sides[side][:count]:
                splits["validation"].append(_row(people[pid], key, pick(pid, key, 1)[0]))
                used.add(pid)

    for key in FIELDS:
        for pid in order:
            if pid not in used:
                splits["relearn"].extend(_row(people[pid], key, q) for q in questions.get((pid, key), ()))
    if not splits["relearn"]:
        raise ValueError(
            "split 'relearn' would be empty for every field: all people with memorized questions are used by the "
            "main, retain-eval or validation splits; lower people_per_field, retain_eval_people or validation_people"
        )
    return splits


# --------------------------------------------------------------------------------------------- writing


def _jsonl_bytes(rows: Sequence[Mapping[str, Any]], columns: Sequence[str]) -> bytes:
    return "".join(json.dumps({c: r[c] for c in columns}, ensure_ascii=False) + "\n" for r in rows).encode("utf-8")


def _atomic_write(path: Path, data: bytes) -> None:
    """Write via a temp file in the same directory + os.replace: readers never see half a file."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, 0o644)  # mkstemp creates 0600; data files are meant to be shared and packaged
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _faker_version() -> str:
    try:
        return metadata.version("faker")
    except metadata.PackageNotFoundError:  # pragma: no cover - faker is imported above
        return "unknown"


def dataset_splits(splits: Mapping[str, Any]) -> tuple[str, ...]:
    """The split names to write: every LACUNA split, plus both retain-eval splits or neither (ValueError otherwise)."""
    eval_present = [s for s in RETAIN_EVAL_SPLITS if s in splits]
    allowed = (*SPLITS, *RETAIN_EVAL_SPLITS)
    missing = [s for s in SPLITS if s not in splits]
    extra = [s for s in splits if s not in allowed]
    if missing or extra:
        raise ValueError(
            f"splits must be exactly {list(SPLITS)} (optionally with {list(RETAIN_EVAL_SPLITS)}); "
            f"missing {missing}, unexpected {extra}"
        )
    if eval_present and len(eval_present) != len(RETAIN_EVAL_SPLITS):
        absent = [s for s in RETAIN_EVAL_SPLITS if s not in splits]
        raise ValueError(f"splits give {eval_present} without {absent}: the retain-eval splits come together")
    return (*SPLITS, *eval_present)


def write_dataset(
    out_dir: str | os.PathLike[str],
    profiles: Sequence[Mapping[str, Any]],
    splits: Mapping[str, Sequence[Mapping[str, Any]]],
    *,
    manifest: Mapping[str, Any] | None = None,
) -> Path:
    """Write ``profiles.jsonl``, one ``<split>.jsonl`` per split and ``manifest.json`` into ``out_dir``.

    The splits are LACUNA's six, plus ``retain_eval`` and ``retain_eval_paraphrased`` when given (both or neither).

    Rows are validated first (a bad row must not become a silent score of 0 later). Each file is
    written atomically; the manifest comes last, so its fingerprint only ever describes complete
    split files. Overwrites a previous dataset (a directory with ``manifest.json``) but refuses any
    other non-empty directory, so a typo in ``--out`` cannot clobber unrelated files.
    """
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise NotADirectoryError(f"dataset output {out} exists and is not a directory")
    if out.is_dir() and any(out.iterdir()) and not (out / "manifest.json").is_file():
        raise FileExistsError(
            f"refusing to write a dataset into {out}: the directory is not empty and holds no manifest.json "
            "(not a previous LACUNA dataset); choose an empty or new directory"
        )
    names = dataset_splits(splits)
    clean = {s: validate_rows(splits[s], source=str(out), split=s) for s in names}
    out.mkdir(parents=True, exist_ok=True)

    profile_columns = PROFILE_COLUMNS if all(c in p for p in profiles for c in PROFILE_COLUMNS) else None
    profile_bytes = "".join(
        json.dumps({c: p[c] for c in profile_columns} if profile_columns else dict(p), ensure_ascii=False) + "\n"
        for p in profiles
    ).encode("utf-8")
    files: dict[str, dict[str, Any]] = {}
    _atomic_write(out / "profiles.jsonl", profile_bytes)
    files["profiles.jsonl"] = {"bytes": len(profile_bytes), "sha256": hashlib.sha256(profile_bytes).hexdigest()}
    for split in names:
        data = _jsonl_bytes(clean[split], QA_COLUMNS)
        _atomic_write(out / f"{split}.jsonl", data)
        files[f"{split}.jsonl"] = {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}

    counts = {
        split: {
            "rows": len(rows),
            "people": len({r["ID"] for r in rows}),
            "by_field": {f.column: sum(r["field"] == f.column for r in rows) for f in FIELDS.values()},
        }
        for split, rows in clean.items()
    }
    roles = [p.get("role", ROLE_TARGET) for p in profiles]
    content: dict[str, Any] = dict(manifest or {})
    content.update(
        {
            "generator": GENERATOR_NAME,
            "generator_version": GENERATOR_VERSION,
            "faker_version": _faker_version(),
            "profiles": {
                "total": len(profiles),
                "target": roles.count(ROLE_TARGET),
                "qa_tuning": roles.count(ROLE_QA_TUNING),
            },
            "counts": counts,
            "files": files,
            # One fingerprint for the whole project: the loader's (canonical JSON, format independent),
            # the same value every evaluation result records.
            "fingerprint": loader_fingerprint({s: [{c: r[c] for c in QA_COLUMNS} for r in clean[s]] for s in names}),
        }
    )
    content.setdefault("seed", None)
    _atomic_write(out / "manifest.json", (json.dumps(content, indent=2, ensure_ascii=False) + "\n").encode("utf-8"))
    return out


def generate_dataset(
    out_dir: str | os.PathLike[str],
    *,
    profiles: int = 1200,
    seed: int = 42,
    people_per_field: int | None = 100,
    validation_people: int | None = 100,
    retain_eval_people: int = 0,
) -> Path:
    """Generate profiles, build the splits and write the dataset (``lacuna data generate``)."""
    rows = generate_profiles(profiles, seed=seed)
    splits = build_splits(
        rows,
        seed=seed,
        people_per_field=people_per_field,
        validation_people=validation_people,
        retain_eval_people=retain_eval_people,
    )
    parameters: dict[str, Any] = {
        "profiles": profiles,
        "people_per_field": people_per_field,
        "validation_people": validation_people,
    }
    if retain_eval_people:  # recorded only when used: the manifests of existing datasets stay as they were
        parameters["retain_eval_people"] = retain_eval_people
    manifest = {
        "seed": seed,
        "parameters": {
            **parameters,
            "locales": list(LOCALES),
            "reference_date": REFERENCE_DATE.isoformat(),
            "qa_tuning_portion": QA_TUNING_PORTION,
            "forget_groups": list(FORGET_GROUPS),
            "retain_groups": list(RETAIN_GROUPS),
        },
    }
    return write_dataset(out_dir, rows, splits, manifest=manifest)
