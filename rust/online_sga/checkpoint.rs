use super::*;
use crate::error::FaError;
use crate::scaling::{read_scaling, write_scaling};
use crate::schedule::{read_schedule, write_schedule};
use crate::state::{expect_kind, Checkpoint, StateMap, StateReader, StateReal, StateValue, StateWriter};

impl<T: StateReal> Checkpoint for OnlineSga<T> {
    const KIND: &'static str = "OnlineSGA";

    fn to_state(&self) -> StateMap {
        let (d, k) = (self.n_features, self.n_components);
        let mut w = StateWriter::new(Self::KIND);
        w.put("n_features", StateValue::Int(d as u64));
        w.put("n_components", StateValue::Int(k as u64));
        w.put("n_warmup", StateValue::Int(self.config.n_warmup));
        w.put("noise_floor", StateValue::Float(self.config.noise_floor));
        w.put("lr", StateValue::Float(self.config.lr));
        w.put("rule", StateValue::Text(self.config.rule.name().into()));
        write_schedule(&mut w, &self.config.step_size);
        write_scaling(&mut w, self.config.scaling, self.scale_sq);
        w.put("n_seen", StateValue::Int(self.n_seen));
        w.array("mean", vec![d], &self.mean);
        w.array("loadings", vec![d, k], &self.f);
        w.array("psi", vec![d], &self.psi);
        w.array("d_last", vec![d], &self.d_last);
        if let Some(p) = &self.pending {
            w.vector("pending_m", &p.m);
            w.matrix("pending_p", &p.p);
        }
        w.0
    }

    fn from_state(state: &StateMap) -> Result<Self> {
        expect_kind(state, Self::KIND)?;
        let r = StateReader(state);
        let (d, k) = (r.usize("n_features")?, r.usize("n_components")?);
        let (scaling, scale_sq) = read_scaling(&r)?;
        let config = SgaConfig {
            lr: r.float("lr")?,
            rule: read_rule(&r)?,
            n_warmup: r.int("n_warmup")?,
            noise_floor: r.float("noise_floor")?,
            step_size: read_schedule(&r)?,
            scaling,
        };
        validate_dims(d, k, config.noise_floor)
            .and_then(|_| check_floor_fits::<T>(config.noise_floor))
            .map_err(|e| FaError::InvalidState(e.to_string()))?;
        if config.lr <= 0.0 {
            return Err(FaError::InvalidState("lr must be > 0".into()));
        }
        check_rule(&config).map_err(|e| FaError::InvalidState(e.to_string()))?;
        let n_seen = r.int("n_seen")?;
        let psi = r.array::<T>("psi", &[d])?;
        // During a data-scaled warm-up ψ's storage holds the running d̄², which may be 0.
        let dsq_in_psi = scaling == Scaling::Data && n_seen <= config.n_warmup;
        if psi
            .iter()
            .any(|v| v.to_f64() < 0.0 || (!dsq_in_psi && v.to_f64() == 0.0))
        {
            return Err(FaError::InvalidState("psi must be positive".into()));
        }
        let pending = if r.has("pending_m") {
            let (m, p) = (r.vector("pending_m", k)?, r.matrix("pending_p", k, k)?);
            let rates = StepRates::new(&config, &m, &p, n_seen).map_err(|e| FaError::InvalidState(e.to_string()))?;
            Some(Pending { m, p, rates })
        } else {
            None
        };
        let sga = OnlineSga {
            n_features: d,
            n_components: k,
            config,
            n_seen,
            mean: r.array::<T>("mean", &[d])?,
            f: r.array::<T>("loadings", &[d, k])?,
            psi,
            d_last: r.array::<T>("d_last", &[d])?,
            pending,
            scale_sq,
            path: SgaPath::detect(k),
            reused: Reused::default(),
        };
        super::checks::check_state(&sga)?;
        Ok(sga)
    }
}

/// The step rule; checkpoints written before the whitened rule existed have no entry and are the gradient rule.
fn read_rule(r: &StateReader) -> Result<SgaRule> {
    if !r.has("rule") {
        return Ok(SgaRule::Gradient);
    }
    SgaRule::parse(r.text("rule")?).map_err(|e| FaError::InvalidState(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::init::{fill_standard_normal, orthonormal_loadings};

    #[test]
    fn resume_from_state_is_bit_identical() {
        let (d, k) = (20, 2);
        let f0 = orthonormal_loadings(d, k, 3).expect("init");
        let mut x = Array2::zeros((50, d));
        fill_standard_normal(x.view_mut(), 4);
        let cfg = SgaConfig {
            n_warmup: 5,
            lr: 0.01,
            ..SgaConfig::default()
        };
        let mut a = OnlineSga::<f64>::new(d, k, f0.view(), cfg).expect("new");
        a.update(x.slice(ndarray::s![..25, ..])).expect("update");
        let mut b = OnlineSga::<f64>::from_state(&a.to_state()).expect("restore");
        a.update(x.slice(ndarray::s![25.., ..])).expect("update");
        b.update(x.slice(ndarray::s![25.., ..])).expect("update");
        assert_eq!(a, b);
        let mut broken = a.to_state();
        broken.remove("psi");
        assert!(OnlineSga::<f64>::from_state(&broken).is_err());
    }
}
