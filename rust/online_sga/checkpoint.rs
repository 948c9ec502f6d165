use super::*;
use crate::error::FaError;
use crate::state::{expect_kind, Checkpoint, StateMap, StateReader, StateReal, StateValue, StateWriter};

impl<T: StateReal> Checkpoint for OnlineSga<T> {
    const KIND: &'static str = "OnlineSGA";

    fn to_state(&self) -> StateMap {
        let (d, k) = (self.n_features, self.n_components);
        let mut w = StateWriter::new(Self::KIND);
        w.put("n_features", StateValue::Int(d as u64));
        self.step.write_state(&mut w);
        w.array("mean", vec![d], &self.mean);
        w.array("loadings", vec![d, k], &self.f);
        w.array("psi", vec![d], &self.psi);
        w.array("d_last", vec![d], &self.d_last);
        w.0
    }

    fn from_state(state: &StateMap) -> Result<Self> {
        expect_kind(state, Self::KIND)?;
        let r = StateReader(state);
        let d = r.usize("n_features")?;
        let step = SgaKkStep::read_state::<T>(&r, d)?;
        let k = step.n_components;
        let psi = r.array::<T>("psi", &[d])?;
        // During a data-scaled warm-up ψ's storage holds the running d̄², which may be 0.
        let dsq_in_psi = step.config.scaling == Scaling::Data && !step.is_fitted();
        if psi
            .iter()
            .any(|v| v.to_f64() < 0.0 || (!dsq_in_psi && v.to_f64() == 0.0))
        {
            return Err(FaError::InvalidState("psi must be positive".into()));
        }
        let sga = OnlineSga {
            n_features: d,
            n_components: k,
            step,
            mean: r.array::<T>("mean", &[d])?,
            f: r.array::<T>("loadings", &[d, k])?,
            psi,
            d_last: r.array::<T>("d_last", &[d])?,
            path: SgaPath::detect(k),
            reused: Reused::default(),
        };
        super::checks::check_state(&sga)?;
        Ok(sga)
    }
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
