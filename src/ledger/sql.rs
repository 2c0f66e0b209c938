//! What the SQL ledgers share: the table, the column list, and turning a row into a record.

use super::{LedgerError, OperationRecord, OperationStatus, SavedResponse, from_millis};

/// The ledger's table.
pub(crate) const TABLE: &str = "idempotent_operations";

/// The columns, in the order [`RawRow`] expects them.
pub(crate) const COLUMNS: &str = "key, scope, fingerprint, status, attempts, first_attempt_at, \
     last_attempt_at, lease_owner, lease_expires_at, response_status, response_headers, \
     response_body, expires_at";

/// The schema, with the body column's type (`BLOB` or `BYTEA`) filled in.
pub(crate) fn schema(bytes_type: &str) -> String {
    format!(
        "CREATE TABLE IF NOT EXISTS {TABLE} (
            key               TEXT PRIMARY KEY,
            scope             TEXT NOT NULL,
            fingerprint       TEXT NOT NULL,
            status            TEXT NOT NULL,
            attempts          INTEGER NOT NULL,
            first_attempt_at  BIGINT NOT NULL,
            last_attempt_at   BIGINT,
            lease_owner       TEXT,
            lease_expires_at  BIGINT,
            response_status   INTEGER,
            response_headers  TEXT,
            response_body     {bytes_type},
            expires_at        BIGINT NOT NULL
        )"
    )
}

/// The index on `expires_at`, for purges.
pub(crate) fn index() -> String {
    format!("CREATE INDEX IF NOT EXISTS {TABLE}_expires_at ON {TABLE} (expires_at)")
}

/// A statement that fails unless the table has every column: run after `CREATE TABLE IF NOT
/// EXISTS`, which keeps a table of another shape as it is.
pub(crate) fn probe() -> String {
    format!("SELECT {COLUMNS} FROM {TABLE} WHERE 1 = 0")
}

/// A row as the drivers read it, before validation.
#[derive(Debug)]
pub(crate) struct RawRow {
    pub(crate) key: String,
    pub(crate) scope: String,
    pub(crate) fingerprint: String,
    pub(crate) status: String,
    pub(crate) attempts: i64,
    pub(crate) first_attempt_at: i64,
    pub(crate) last_attempt_at: Option<i64>,
    pub(crate) lease_owner: Option<String>,
    pub(crate) lease_expires_at: Option<i64>,
    pub(crate) response_status: Option<i64>,
    pub(crate) response_headers: Option<String>,
    pub(crate) response_body: Option<Vec<u8>>,
    pub(crate) expires_at: i64,
}

impl RawRow {
    /// Validates the row.
    pub(crate) fn into_record(self) -> Result<OperationRecord, LedgerError> {
        let attempts = u32::try_from(self.attempts).map_err(|_| {
            LedgerError::corrupt(format!("row {}: attempts {}", self.key, self.attempts))
        })?;
        let response = match self.response_status {
            None => None,
            Some(status) => {
                let status = u16::try_from(status)
                    .ok()
                    .filter(|s| (100..=999).contains(s))
                    .ok_or_else(|| {
                        LedgerError::corrupt(format!("row {}: response status {status}", self.key))
                    })?;
                let headers = match &self.response_headers {
                    None => Vec::new(),
                    Some(json) => serde_json::from_str(json).map_err(|err| {
                        LedgerError::corrupt(format!("row {}: response headers", self.key))
                            .with_source(err)
                    })?,
                };
                Some(SavedResponse {
                    status,
                    headers,
                    body: self.response_body,
                })
            }
        };
        Ok(OperationRecord {
            status: OperationStatus::parse(&self.status)?,
            attempts,
            first_attempt_at: from_millis(self.first_attempt_at),
            last_attempt_at: self.last_attempt_at.map(from_millis),
            lease_owner: self.lease_owner,
            lease_expires_at: self.lease_expires_at.map(from_millis),
            response,
            expires_at: from_millis(self.expires_at),
            key: self.key,
            scope: self.scope,
            fingerprint: self.fingerprint,
        })
    }
}

/// The saved response's columns: status, headers as JSON, body.
pub(crate) fn response_columns(
    response: Option<&SavedResponse>,
) -> (Option<i64>, Option<String>, Option<Vec<u8>>) {
    match response {
        None => (None, None, None),
        Some(saved) => (
            Some(i64::from(saved.status)),
            // Serializing pairs of strings cannot fail.
            serde_json::to_string(&saved.headers).ok(),
            saved.body.clone(),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::LedgerErrorKind;

    fn raw() -> RawRow {
        RawRow {
            key: "k".into(),
            scope: "s".into(),
            fingerprint: "f".into(),
            status: "succeeded".into(),
            attempts: 2,
            first_attempt_at: 1_000,
            last_attempt_at: Some(2_000),
            lease_owner: None,
            lease_expires_at: None,
            response_status: Some(201),
            response_headers: Some(r#"[["content-type","text/plain"]]"#.into()),
            response_body: Some(b"ok".to_vec()),
            expires_at: 9_000,
        }
    }

    #[test]
    fn a_valid_row_decodes_and_round_trips_its_response() {
        let record = raw().into_record().expect("valid");
        assert_eq!(record.attempts, 2);
        let response = record.response.expect("saved");
        assert_eq!(response.status, 201);
        let (status, headers, body) = response_columns(Some(&response));
        assert_eq!(status, Some(201));
        assert_eq!(
            headers.as_deref(),
            Some(r#"[["content-type","text/plain"]]"#)
        );
        assert_eq!(body.as_deref(), Some(&b"ok"[..]));
    }

    #[test]
    fn impossible_values_are_corrupt_not_panics() {
        let cases: [fn(&mut RawRow); 4] = [
            |r| r.attempts = -1,
            |r| r.status = "done".into(),
            |r| r.response_status = Some(70_000),
            |r| r.response_headers = Some("{not json".into()),
        ];
        for break_it in cases {
            let mut row = raw();
            break_it(&mut row);
            let err = row.into_record().expect_err("corrupt");
            assert_eq!(err.kind(), LedgerErrorKind::Corrupt);
        }
    }
}
