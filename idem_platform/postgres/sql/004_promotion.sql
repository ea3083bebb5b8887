-- Safe casts for `idem retype` (typed companions of evolved text columns; the command was
-- `idem promote` when this version was written).
-- The stored names (idem.promote_<kind>, this file's name) predate the rename to "retype" and
-- stay: they live in users' databases and this version is applied once, never rewritten.
--
-- One function per target type, text in, typed value or NULL out; none ever raises
-- (no exception block either: every input is checked before any cast that could
-- fail), so a backfill batch or a commit's INSERT never fails on a value. They give
-- what the type's ingest converter (DESIGN §3) makes of the text *read as JSON*: a
-- text that is a JSON number, `true` or `false` is that value, any other text is the
-- string itself. So 42 and "42" (both stored as the text 42) retype alike, and a
-- row gets the same typed value whether the backfill or a later commit fills it.
-- idem_platform/postgres/retype.py holds the same rules in Python
-- (`reference_cast`), and the tests check one against the other.
--
-- PostgreSQL 15 has no pg_input_is_valid (16+): plain regex guards and range checks.

-- The exact rules are plpgsql functions that parse by position (PostgreSQL's regex
-- engine is slow with bounded repetitions and capture groups: a regexp_match costs
-- ~70 µs a row, a plain `~` without them under 1 µs). The public casts
-- (idem.promote_<kind>) are SQL functions the planner inlines: the common shapes take
-- a guarded fast path (a plain cast that cannot fail there), the rest the exact one.

-- A JSON number token as a double, as Python's json + float() read it: correctly
-- rounded; NULL when the value is no finite double (1e400, or an integer beyond
-- the double range: the converters refuse those); magnitudes below the smallest
-- subnormal read as a signed zero, as Python's do. Texts over 1000 characters are
-- never numbers here (no JSON number written by anyone is that long).
CREATE FUNCTION idem.promote_number_exact(v text) RETURNS double precision
LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE AS $$
DECLARE
    negative boolean;
    body text;
    at integer;
    mantissa text;
    exponent text;
    int_part text;
    frac_part text;
    digits text;
    e10 integer;
    n numeric;
BEGIN
    IF length(v) > 1000 OR v !~ '^-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?$' THEN
        RETURN NULL;
    END IF;
    negative := left(v, 1) = '-';
    body := CASE WHEN negative THEN substr(v, 2) ELSE v END;
    at := strpos(translate(body, 'E', 'e'), 'e');
    IF at > 0 THEN
        mantissa := left(body, at - 1);
        exponent := substr(body, at + 1);
    ELSE
        mantissa := body;
    END IF;
    at := strpos(mantissa, '.');
    IF at > 0 THEN
        int_part := left(mantissa, at - 1);
        frac_part := substr(mantissa, at + 1);
    ELSE
        int_part := mantissa;
    END IF;
    digits := ltrim(int_part || coalesce(frac_part, ''), '0');
    IF digits = '' THEN  -- zero; Python keeps the sign of a float literal (-0.0), not of -0
        RETURN CASE WHEN negative AND (frac_part IS NOT NULL OR exponent IS NOT NULL)
                    THEN '-0'::double precision ELSE 0 END;
    END IF;
    IF length(ltrim(ltrim(coalesce(exponent, '0'), '+-'), '0')) > 6 THEN
        -- |exponent| >= 10^6: overflows (NULL) or underflows to a signed zero
        IF left(exponent, 1) = '-' THEN
            RETURN CASE WHEN negative THEN '-0'::double precision ELSE 0 END;
        END IF;
        RETURN NULL;
    END IF;
    -- the decimal exponent of the first significant digit
    IF int_part <> '0' THEN
        e10 := length(int_part) - 1;
    ELSE
        e10 := -(length(frac_part) - length(ltrim(frac_part, '0')) + 1);
    END IF;
    e10 := e10 + coalesce(exponent, '0')::integer;
    IF e10 > 308 THEN
        RETURN NULL;
    END IF;
    IF e10 < -324 THEN
        RETURN CASE WHEN negative THEN '-0'::double precision ELSE 0 END;
    END IF;
    n := v::numeric;  -- safe: at most 1000 digits, a scale far below 16383
    IF e10 = 308 AND abs(n) >= 2::numeric ^ 1024 - 2::numeric ^ 970 THEN
        RETURN NULL;  -- rounds to infinity
    END IF;
    IF e10 = -324 AND abs(n) * 2::numeric ^ 1075 <= 1 THEN
        RETURN CASE WHEN negative THEN '-0'::double precision ELSE 0 END;  -- rounds to zero
    END IF;
    RETURN n::double precision;  -- numeric -> text -> strtod: correctly rounded
END
$$;

-- Integers in int64; integral floats (3.0, 1e3) as their integer (DESIGN §3: long).
CREATE FUNCTION idem.promote_long_exact(v text) RETURNS bigint
LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE AS $$
DECLARE
    d double precision;
BEGIN
    IF v ~ '^-?(0|[1-9][0-9]*)$' THEN
        IF length(v) <= 20 AND v::numeric BETWEEN -9223372036854775808 AND 9223372036854775807 THEN
            RETURN v::bigint;
        END IF;
        RETURN NULL;
    END IF;
    d := idem.promote_number_exact(v);
    IF d IS NULL OR d <> trunc(d)
       OR d < '-9223372036854775808'::double precision OR d >= '9223372036854775808'::double precision THEN
        RETURN NULL;
    END IF;
    RETURN d::bigint;
END
$$;

-- RFC 3339 (any offset -> UTC; T, t or a space; Z or z; digits past nanoseconds
-- ignored) or integer epoch nanoseconds, within timestamp[ns] (1677..2262), rounded
-- to microseconds half up as the ingest path rounds them.
CREATE FUNCTION idem.promote_timestamp_exact(v text) RETURNS timestamp with time zone
LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE AS $$
DECLARE
    y integer;
    mo integer;
    d integer;
    days_in integer;
    zone_length integer := 1;
    fraction text;
    offset_seconds integer := 0;
    yy integer;
    era integer;
    yoe integer;
    doy integer;
    days bigint;
    ns numeric;
    nsb bigint;
    micros bigint;
    rem bigint;
BEGIN
    IF v ~ '^-?(0|[1-9][0-9]*)$' THEN
        IF length(v) > 20 THEN
            RETURN NULL;
        END IF;
        ns := v::numeric;
    ELSE
        IF length(v) < 20 OR v !~ '^[0-9][0-9][0-9][0-9]-[0-9][0-9]-[0-9][0-9][Tt ][0-9][0-9]:[0-9][0-9]:[0-9][0-9](\.[0-9]+)?([Zz]|[+-][0-9][0-9]:[0-9][0-9])$' THEN
            RETURN NULL;
        END IF;
        y := substr(v, 1, 4)::integer;
        mo := substr(v, 6, 2)::integer;
        d := substr(v, 9, 2)::integer;
        IF mo < 1 OR mo > 12 THEN
            RETURN NULL;
        END IF;
        days_in := CASE  -- (a CASE inside an IF's condition would end it at its first THEN)
            WHEN mo = 2 THEN CASE WHEN y % 4 = 0 AND (y % 100 <> 0 OR y % 400 = 0) THEN 29 ELSE 28 END
            WHEN mo IN (4, 6, 9, 11) THEN 30
            ELSE 31
        END;
        IF d < 1 OR d > days_in OR substr(v, 12, 2)::integer > 23 OR substr(v, 15, 2)::integer > 59 OR substr(v, 18, 2)::integer > 59 THEN
            RETURN NULL;
        END IF;
        IF right(v, 1) NOT IN ('Z', 'z') THEN
            zone_length := 6;
            IF substr(v, length(v) - 4, 2)::integer > 23 OR right(v, 2)::integer > 59 THEN
                RETURN NULL;
            END IF;
            offset_seconds := (substr(v, length(v) - 4, 2)::integer * 3600 + right(v, 2)::integer * 60)
                * CASE WHEN substr(v, length(v) - 5, 1) = '+' THEN 1 ELSE -1 END;
        END IF;
        fraction := CASE WHEN substr(v, 20, 1) = '.' THEN substr(v, 21, length(v) - 20 - zone_length) ELSE '' END;
        -- days since 1970-01-01 of a proleptic Gregorian date (H. Hinnant), years 0000..9999
        yy := y - CASE WHEN mo <= 2 THEN 1 ELSE 0 END;
        era := CASE WHEN yy >= 0 THEN yy / 400 ELSE (yy - 399) / 400 END;
        yoe := yy - era * 400;
        doy := (153 * (mo + CASE WHEN mo > 2 THEN -3 ELSE 9 END) + 2) / 5 + d - 1;
        days := era::bigint * 146097 + yoe * 365 + yoe / 4 - yoe / 100 + doy - 719468;
        ns := (days * 86400 + substr(v, 12, 2)::integer * 3600 + substr(v, 15, 2)::integer * 60
               + substr(v, 18, 2)::integer - offset_seconds)::numeric * 1000000000
              + CASE WHEN fraction = '' THEN 0 ELSE rpad(left(fraction, 9), 9, '0')::bigint END;
    END IF;
    IF ns < -9223372036854775808 OR ns > 9223372036854775807 THEN
        RETURN NULL;
    END IF;
    nsb := ns::bigint;
    micros := nsb / 1000;  -- truncates toward zero: make it a floor, then round half up
    rem := nsb % 1000;
    IF rem < 0 THEN
        micros := micros - 1;
        rem := rem + 1000;
    END IF;
    IF rem >= 500 THEN
        micros := micros + 1;
    END IF;
    days := micros / 86400000000;
    rem := micros % 86400000000;
    IF rem < 0 THEN
        days := days - 1;
        rem := rem + 86400000000;
    END IF;
    RETURN (timestamp '1970-01-01 00:00:00' + days * interval '1 day' + rem * interval '1 microsecond')
        AT TIME ZONE 'UTC';
END
$$;

-- The public casts.

CREATE FUNCTION idem.promote_real(v text) RETURNS double precision
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT CASE
        -- at most 25 characters and a 2-digit exponent: no overflow, no underflow
        WHEN length(v) <= 25 AND v ~ '^-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9][0-9]?)?$'
            THEN CASE WHEN v = '-0' THEN 0 ELSE v::double precision END
        WHEN v ~ '^-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?$' THEN idem.promote_number_exact(v)
    END
$$;

CREATE FUNCTION idem.promote_long(v text) RETURNS bigint
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT CASE
        WHEN length(v) <= 18 AND v ~ '^-?(0|[1-9][0-9]*)$' THEN v::bigint
        WHEN v ~ '^-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?$' THEN idem.promote_long_exact(v)
    END
$$;

CREATE FUNCTION idem.promote_bool(v text) RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT CASE v WHEN 'true' THEN true WHEN 'false' THEN false END
$$;

-- STABLE, not IMMUTABLE, only because text -> timestamptz is (the fast path's inputs
-- all carry their offset, so the session's TimeZone never matters).
CREATE FUNCTION idem.promote_timestamp(v text) RETURNS timestamp with time zone
LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT CASE
        -- years 1900..2199 (inside timestamp[ns] whatever the offset), a day every
        -- month has, offsets PostgreSQL reads (to 15:59), at most microseconds
        WHEN length(v) BETWEEN 20 AND 32 AND v ~ '^(19|20|21)[0-9][0-9]-((0[1-9]|1[0-2])-(0[1-9]|1[0-9]|2[0-8])|(0[13-9]|1[0-2])-(29|30)|(0[13578]|1[02])-31)[T ]([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](\.[0-9][0-9]?[0-9]?[0-9]?[0-9]?[0-9]?)?(Z|[+-](0[0-9]|1[0-5]):[0-5][0-9])$'
            THEN v::timestamp with time zone
        ELSE idem.promote_timestamp_exact(v)
    END
$$;
