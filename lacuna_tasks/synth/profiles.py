"""Synthetic PANORAMA-style people: the profiles every LACUNA dataset and testbed is built from.

LACUNA (``docs/definitions.md#profiles-and-pii-fields``, ``#qa-tuning``) trains on PANORAMA-Plus profiles. PANORAMA
itself is too large to bundle and needs network access, so this module re-creates it: Faker profiles in the 8 English
locales with the 35 PANORAMA columns and the same formats for the four target fields (email, phone, birth city,
driver's license), plus LACUNA's ``group_id`` and the held-out ``qa_tuning`` role.

Everything is deterministic for a seed and a Faker version: one seeded ``Faker(locale)`` per locale and
``random.Random`` streams from :mod:`lacuna_tasks.seeding` (SHA-256, never ``hash()``), and never the date of today
(ages are computed against the fixed ``REFERENCE_DATE``). The texts written about these people are
:mod:`lacuna_tasks.synth.bios`; the forget / retain / ... splits are :mod:`lacuna_tasks.synth.splits`.
"""

from __future__ import annotations

import datetime as dt
import random
import re
import unicodedata
import uuid
from collections.abc import Callable, Sequence
from importlib import metadata
from typing import Any

from faker import Faker

from lacuna_tasks.schema import NUM_GROUPS, ROLE_QA_TUNING, ROLE_TARGET
from lacuna_tasks.seeding import stable_rng, stable_seed

#: The generator's name in dataset manifests and the namespace of its seeded streams. It names the module that
#: first held the generator: changing it would change every generated dataset for the same seed.
GENERATOR_NAME = "lacuna_tasks.generate"  # a seed of every random stream: fixed, whatever the module path
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

#: LACUNA holds 0.125 of the profiles out for instruction tuning (150 of 1,200; docs/definitions.md#qa-tuning).
QA_TUNING_PORTION = 0.125
MIN_PROFILES = 2 * NUM_GROUPS
#: Ages are exact at this date, so profiles do not change with the day they are generated.
REFERENCE_DATE = dt.date(2026, 1, 1)
#: Attempts at drawing a unique value (name, email, number, question) before giving up.
MAX_REDRAWS = 1000

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
_MIN_NUMBER_DIGITS = 7  # phone numbers and licence numbers have at least this many digits


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
    for _ in range(MAX_REDRAWS):
        value = draw()
        if ok(value):
            return value
    raise RuntimeError(f"could not draw a unique {what} in {MAX_REDRAWS} attempts; the locale pool is exhausted")


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

    for _ in range(MAX_REDRAWS):
        first, birth_last = first_name_of(), fake.last_name()
        last = spouse_last if takes_spouse_name else birth_last
        if f"{first} {last}" not in taken.names:
            break
        if takes_spouse_name:  # the spouse's surname is fixed: vary it too, or only the first name moves
            spouse_last = fake.last_name()
    else:
        raise RuntimeError(f"could not draw a unique name in {MAX_REDRAWS} attempts for locale {locale}")
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
    rng = stable_rng(GENERATOR_NAME, "profiles", seed)
    fakers: dict[str, Faker] = {}
    for locale in LOCALES:
        fake = Faker(locale)
        fake.seed_instance(stable_seed(GENERATOR_NAME, "faker", seed, locale))
        fakers[locale] = fake
    taken = _Registry()
    profiles = [
        _make_profile(fakers[LOCALES[i % len(LOCALES)]], LOCALES[i % len(LOCALES)], rng, taken) for i in range(n)
    ]

    group_rng = stable_rng(GENERATOR_NAME, "groups", seed)
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


def faker_version() -> str:
    """The installed Faker's version: profiles are reproducible for a seed and this version (recorded in manifests)."""
    try:
        return metadata.version("faker")
    except metadata.PackageNotFoundError:  # pragma: no cover - faker is imported above
        return "unknown"
